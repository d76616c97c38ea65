"""The commands around a benchmark: capture, compare, inspect (and their helpers)."""
