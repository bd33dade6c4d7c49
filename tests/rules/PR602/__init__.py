"""PR602 utilization-vs-achieved-gap fixtures."""
