"""PR101 straggler-rank fixtures."""
