"""plasmient-report: utilization vs achieved fraction of peak, and where the rest of the peak went."""

__version__ = "0.1.0"
