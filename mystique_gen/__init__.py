"""mystique-gen: compile a PyTorch execution trace into a standalone benchmark script."""

__version__ = "0.1.0"
