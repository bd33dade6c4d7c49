"""PR403 pageable-or-sync-memcpy fixtures."""
