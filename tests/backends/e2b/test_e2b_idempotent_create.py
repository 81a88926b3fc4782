"""A create whose answer is lost never leaves two sandboxes behind.

Every E2B create carries an ``Idempotency-Key``, one per logical create. A service known to
honour it (``idempotent_creates=True``: the local service, ``E2bServer``) is sent the create
again with the same key and answers the sandbox the first one made; any other service is
never sent it twice: the error says a sandbox may exist and when it expires.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.local import LocalE2bService
from piship_remote.model.errors import PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.testing import E2bServer
from piship_remote.transport import HttpReply, Transport, TransportError
from tests.support.local_service import needs_bwrap

E2bFactory = Callable[..., E2bServer]

pytestmark = pytest.mark.timeout(60)


class LosesFirstCreateAnswer(Transport):
    """The wire of a create that reached the service but whose answer never came back."""

    def __init__(self) -> None:
        super().__init__(redactor=Redactor())
        self.keys: list[str] = []
        self._lost = False

    def request(
        self, method: str, url: str, *, headers: Mapping[str, str] | None = None, **kwargs: Any
    ) -> HttpReply:
        reply = super().request(method, url, headers=headers, **kwargs)
        if method == "POST" and url.endswith("/sandboxes"):
            self.keys.append(dict(headers or {})["Idempotency-Key"])
            if not self._lost:
                self._lost = True
                reply.close()
                raise TransportError(
                    "the connection was reset", request_sent=True, component="sandbox"
                )
        return reply


@pytest.fixture
def profile(tmp_path: Path) -> SandboxProfile:
    return SandboxProfile(workspace=str(tmp_path))


@pytest.fixture
def lossy() -> Iterator[LosesFirstCreateAnswer]:
    transport = LosesFirstCreateAnswer()
    yield transport
    transport.close()


def test_every_create_carries_an_idempotency_key_of_e2bs_form(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server()
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
    with backend:
        backend.prepare(profile).dispose()
        backend.prepare(profile).dispose()
    keys = [r.headers["idempotency-key"] for r in mock.find("POST", "/sandboxes")]
    assert all(re.fullmatch("[a-z0-9-]{1,255}", key) for key in keys)
    assert len(set(keys)) == 2  # one key per logical create


def test_a_create_refused_for_capacity_is_repeated_with_the_same_key(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server()
    mock.faults.fail_creates(1, status=429, retry_after=0)
    with E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url) as backend:
        backend.prepare(profile).dispose()
    creates = mock.find("POST", "/sandboxes")
    assert len(creates) == 2
    assert creates[0].headers["idempotency-key"] == creates[1].headers["idempotency-key"]


def test_a_lost_answer_from_the_double_is_repeated_and_ends_with_one_sandbox(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server()
    mock.faults.lose_create_answer()
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url, idempotent_creates=True)
    with backend:
        instance = backend.prepare(profile)
        assert mock.live_sandboxes == [instance.sandbox_id]
        instance.dispose()
    creates = mock.find("POST", "/sandboxes")
    assert len(creates) == 2
    assert len({c.headers["idempotency-key"] for c in creates}) == 1
    assert mock.live_sandboxes == []


def test_a_lost_answer_is_not_repeated_when_the_service_is_not_known_to_honour_the_key(
    e2b_server: E2bFactory, profile: SandboxProfile
) -> None:
    mock = e2b_server(idempotency_keys=False)
    mock.faults.lose_create_answer()
    with (
        E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url) as backend,
        pytest.raises(PiShipError) as caught,
    ):
        backend.prepare(profile)
    assert caught.value.code == "SANDBOX_UNAVAILABLE"
    assert caught.value.retryable is False
    assert "a sandbox may have been created" in str(caught.value)
    assert mock.count("POST", "/sandboxes") == 1
    assert len(mock.live_sandboxes) == 1  # one, expiring on its own; never two


def test_a_double_that_ignores_the_key_makes_a_second_sandbox_for_a_repeat(
    e2b_server: E2bFactory,
) -> None:
    # Why the repeat is kept for services known to honour the key.
    import requests

    mock = e2b_server(idempotency_keys=False)
    headers = {"Idempotency-Key": "build-1"}
    body = {"templateID": "base", "timeout": 60, "metadata": {}}
    for _ in range(2):
        requests.post(mock.url + "/sandboxes", json=body, headers=headers, timeout=10).close()
    assert len(mock.live_sandboxes) == 2


def test_the_double_refuses_a_key_reused_for_another_request(e2b_server: E2bFactory) -> None:
    import requests

    mock = e2b_server()
    headers = {"Idempotency-Key": "build-2"}
    first = requests.post(
        mock.url + "/sandboxes", json={"templateID": "a"}, headers=headers, timeout=10
    )
    again = requests.post(
        mock.url + "/sandboxes", json={"templateID": "a"}, headers=headers, timeout=10
    )
    other = requests.post(
        mock.url + "/sandboxes", json={"templateID": "b"}, headers=headers, timeout=10
    )
    assert first.json()["sandboxID"] == again.json()["sandboxID"]
    assert other.status_code == 422
    assert len(mock.live_sandboxes) == 1


def test_the_double_refuses_a_key_not_of_e2bs_form(e2b_server: E2bFactory) -> None:
    import requests

    mock = e2b_server()
    answer = requests.post(
        mock.url + "/sandboxes", json={}, headers={"Idempotency-Key": "Not_Valid"}, timeout=10
    )
    assert answer.status_code == 400
    assert mock.live_sandboxes == []


def test_a_lost_answer_over_the_wire_is_repeated_with_the_same_key_on_the_double(
    e2b_server: E2bFactory, profile: SandboxProfile, lossy: LosesFirstCreateAnswer
) -> None:
    mock = e2b_server()
    backend = E2bCompatibleBackend(
        endpoint=mock.url, envd_url=mock.url, client=lossy, idempotent_creates=True
    )
    instance = backend.prepare(profile)
    assert mock.live_sandboxes == [instance.sandbox_id]
    instance.dispose()
    assert len(lossy.keys) == 2 and lossy.keys[0] == lossy.keys[1]


@needs_bwrap
def test_a_lost_answer_from_the_local_service_ends_with_one_sandbox(
    service: LocalE2bService, profile: SandboxProfile, lossy: LosesFirstCreateAnswer
) -> None:
    backend = service.backend(client=lossy)
    instance = backend.prepare(profile)
    try:
        assert [s.id for s in backend.list_owned()] == [instance.sandbox_id]
    finally:
        instance.dispose()
    assert len(lossy.keys) == 2 and lossy.keys[0] == lossy.keys[1]
