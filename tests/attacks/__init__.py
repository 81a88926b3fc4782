"""The attacks on the local service, each reproduced as it was found, asserting it now fails."""
