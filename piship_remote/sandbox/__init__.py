"""One sandbox: activation, the Sandbox facade, the run engine, files, the lifecycle registry."""
