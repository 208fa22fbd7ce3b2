"""Which triplet to ask next (the scheduler) and how reliable the answers are (self-consistency,
Cohen's κ).
"""
