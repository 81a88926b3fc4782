"""The policy, the containment report, the environment filter, errors and redaction (no I/O)."""
