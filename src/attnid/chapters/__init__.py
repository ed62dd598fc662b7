"""What the book's chapters draw and say, as tested functions: each chapter module returns figures
(``fig_*``), tables (``table_*`` -> DataFrame) and ``facts`` (numbers and phrases for myst-nb ``glue``)
computed from the records or the math, so that a chapter keeps only prose, parameters and calls.

It builds on :mod:`attnid` and :mod:`attnid.lm`; nothing below it imports it.
"""
