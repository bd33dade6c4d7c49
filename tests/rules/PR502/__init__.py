"""PR502 host-sync-stall fixtures."""
