"""Run shell commands in remote sandboxes from synchronous Python."""

__version__ = "0.1.0"
