"""Per-rule fixtures (one folder per code: tests/rules/<CODE>/) and the rule engine's own tests."""
