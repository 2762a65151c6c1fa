"""Seeing a converted dataset: a contact sheet, a class histogram and an HTML report.

Each step has a module of its own: `gather` reads the dataset through the reader (what training
sees), `sheet` draws the contact sheet with Pillow, `class_chart` the histogram with Pillow too,
and `html_report` renders the page. `python -m tfdata_readers.inspect` ties them together.
"""
