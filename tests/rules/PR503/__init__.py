"""PR503 input-bound-step fixtures."""
