"""Backends: turn a Program into Python source (names, expressions, layout, templates)."""
