"""PR301 memory-bound-kernel fixtures."""
