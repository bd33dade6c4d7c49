"""PR102 exposed-communication fixtures."""
