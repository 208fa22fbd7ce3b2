"""Data in and out: dataset folders (import as a three-way merge, export), their readers, other tools'
outlines (convert), the outline formats (COCO, GeoJSON, Label Studio), the one export registry, CSV cells a
spreadsheet will not run, and photos uploaded in the browser.
"""
