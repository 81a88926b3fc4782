"""pytest fixtures for the test doubles: factories whose servers stop at teardown.

    def test_runs(e2b_server, kubernetes_server):
        mock = e2b_server(command=lambda start: {"exit_code": 3})
        cluster_mock = kubernetes_server(lambda command: {"stdout": "ok\\n"})

Each factory takes the same arguments as :class:`~piship_remote.testing.E2bServer`
and :class:`~piship_remote.testing.KubernetesServer`; every server it made is
closed (held requests released) when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import pytest

if TYPE_CHECKING:
    # Imported inside the fixtures: the plugin loads in every pytest run, with or
    # without the test extra the doubles need.
    from piship_remote.testing.e2b_server import E2bServer
    from piship_remote.testing.kubernetes_server import KubernetesServer
    from piship_remote.testing.recorder import RecordingServer

__all__ = ["e2b_server", "kubernetes_server"]

_P = ParamSpec("_P")
_T = TypeVar("_T", bound="RecordingServer")


def _closing_factory(
    make: Callable[_P, _T],
) -> Iterator[Callable[_P, _T]]:
    servers: list[RecordingServer] = []

    def factory(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        server = make(*args, **kwargs)
        servers.append(server)
        return server

    try:
        yield factory
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def e2b_server() -> Iterator[Callable[..., E2bServer]]:
    """A factory of started :class:`E2bServer` instances, all closed at teardown."""
    from piship_remote.testing.e2b_server import E2bServer

    yield from _closing_factory(E2bServer)


@pytest.fixture
def kubernetes_server() -> Iterator[Callable[..., KubernetesServer]]:
    """A factory of started :class:`KubernetesServer` instances, all closed at teardown."""
    from piship_remote.testing.kubernetes_server import KubernetesServer

    yield from _closing_factory(KubernetesServer)
