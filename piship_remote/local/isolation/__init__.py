"""What holds a local sandbox in: bubblewrap, the user map, mounts, limits, network, the agent."""
