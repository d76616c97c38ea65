"""Sources: read trace files (ET, Kineto) into plain, validated records."""
