"""The sandbox backends: E2B-compatible services and Kubernetes agent-sandbox."""
