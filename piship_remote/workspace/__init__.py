"""The workspace between host and sandbox: what a push sends, what a pull brings back, bounded."""
