"""Renderers: each turns the verdict document (and the store) into one output. None parses input files."""
