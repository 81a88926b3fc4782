"""The Kubernetes agent-sandbox backend: claims and keepalive, the router, files, detached jobs.

>>> from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
"""

from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend, runtime_command

__all__ = ["KubernetesAgentSandboxBackend", "runtime_command"]
