"""PR701 device-memory-pressure fixtures."""
