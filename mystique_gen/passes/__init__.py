"""Stage 3: passes over the IR (select, lower, tensors, values, filters, ...)."""
