"""The official E2B Python SDK pointed at a local E2B service on loopback.

Import it after ``pytest.importorskip("e2b")``: it needs the SDK.
"""

from __future__ import annotations

import attrs
from e2b import Sandbox, SandboxQuery


@attrs.frozen
class Target:
    """A service's URL and key, and the SDK calls made against it."""

    url: str
    api_key: str

    def options(self) -> dict[str, object]:
        return {"api_key": self.api_key, "api_url": self.url, "request_timeout": 10}

    def create(self, *args: object, **extra: object) -> Sandbox:
        return Sandbox.create(*args, sandbox_url=self.url, **self.options(), **extra)  # type: ignore[arg-type]

    def connect(self, sandbox_id: str, **extra: object) -> Sandbox:
        return Sandbox.connect(sandbox_id, sandbox_url=self.url, **self.options(), **extra)  # type: ignore[arg-type]

    def listed(self, query: SandboxQuery) -> list[str]:
        page = Sandbox.list(query=query, **self.options()).next_items()  # type: ignore[arg-type]
        return [s.sandbox_id for s in page]
