"""PR504 gpu-idle-gap fixtures."""
