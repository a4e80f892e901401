"""Shared by every system: device, stack, compile, numerics, metrics, files. Never a second copy."""
