"""PR201 pipeline-bubble fixtures."""
