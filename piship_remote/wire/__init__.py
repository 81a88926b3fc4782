"""Sandbox shapes on the wire, shared by the client, the doubles and the local service (no I/O)."""
