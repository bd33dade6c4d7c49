"""PR501 launch-bound-stream fixtures."""
