"""PR302 unfused-elementwise-chain fixtures."""
