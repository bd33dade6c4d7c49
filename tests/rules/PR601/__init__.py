"""PR601 clock-throttling fixtures."""
