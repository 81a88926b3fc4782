"""The host secrets every test's sweep looks for in what leaves the host."""

from __future__ import annotations

HOST_SECRETS = (
    "sk-live-never-in-remote-backends",
    "aws-never-in-remote-backends",
    "ghp_never_in_remote_backends_0000000000",
    "sk-demo-host-secret",
    "acme-secret-token",
    "aws-secret-value",
    "github-secret-value",
)
