"""Stage 4: turn the IR into Python source (names, expressions, layout, templates)."""
