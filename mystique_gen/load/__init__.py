"""Stage 1: read trace files into plain, validated records."""
