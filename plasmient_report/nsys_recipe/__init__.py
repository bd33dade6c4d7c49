"""The `plasmient` recipe for Nsight Systems' recipe framework (`nsys recipe plasmient --input DIR --output OUT`).

`plasmient/` is the recipe folder nsys loads (metadata.json + the Recipe subclass, the only module that imports
NVIDIA's `nsys_recipe`); `shim.py` holds its pure parts — one report's export and job identity, reports into runs,
the batch mapper and reducer — so they are tested without nsys. `recipe_path()` is what NSYS_RECIPE_PATH names.
"""

from __future__ import annotations

from pathlib import Path

RECIPE = "plasmient"


def recipe_path() -> Path:
    """The folder holding the recipe folder `plasmient/`: put it on NSYS_RECIPE_PATH."""
    return Path(__file__).resolve().parent
