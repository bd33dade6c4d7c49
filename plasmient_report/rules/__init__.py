"""The rule engine (findings by layer) lands here; see docs and SPEC §5."""
