"""The wound over time and across readers: follow-up (visits, tracks, sizes, links) and its fields,
physical measurement, the aligned track views, and second readings (each reader's own outline layer, Dice).
"""
