"""The memory-layer rules (one file per rule, named after it; codes in ../codes.py)."""
