"""One local sandbox and the registry of them: boot, the agent's lifetime, pause, files, listing."""
