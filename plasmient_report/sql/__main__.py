"""`python -m plasmient_report.sql`: print docs/measurements.md, generated from the library's own comments."""

from . import docs

print(docs(), end="")
