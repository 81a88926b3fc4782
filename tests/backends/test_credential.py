"""A backend's credential and the 401 protocol: fresh reads, one renewal, clear refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from piship_remote.backends._credential import Credential, send_credentialed
from piship_remote.model.errors import CREDENTIAL_REQUIRED, PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.testing import E2bServer
from piship_remote.transport import HttpResponse, Transport
from tests.support.quick_http import quick_http_server, route

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    with quick_http_server() as srv:
        yield srv


@pytest.fixture
def redactor() -> Redactor:
    return Redactor()


@pytest.fixture
def transport(redactor: Redactor) -> Iterator[Transport]:
    instance = Transport(redactor=redactor, component="sandbox")
    try:
        yield instance
    finally:
        instance.close()


class Keys:
    """A credential source: ``values`` are read in turn; counts reads and rejections."""

    def __init__(self, *values: str | None, renewed: bool = True) -> None:
        self.values = list(values)
        self.renewed = renewed
        self.reads = 0
        self.rejected = 0

    def read(self) -> str | None:
        value = self.values[min(self.reads, len(self.values) - 1)]
        self.reads += 1
        return value

    def reject(self) -> bool:
        self.rejected += 1
        return self.renewed


def api_key(value: str) -> dict[str, str]:
    return {"X-API-Key": value}


@pytest.fixture
def keyed(server: HTTPServer) -> tuple[str, list[Request], dict[str, int]]:
    """A route answering 200 to ``X-API-Key: good-key-0002``, else ``statuses['bad']``."""
    seen: list[Request] = []
    statuses = {"bad": 401}

    def handler(request: Request) -> Response:
        seen.append(request)
        if request.headers.get("x-api-key") == "good-key-0002":
            return Response('{"ok":true}', content_type="application/json")
        return Response('{"message":"invalid key"}', status=statuses["bad"])

    return route(server, "/api", handler), seen, statuses


def credentialed(
    transport: Transport,
    url: str,
    keys: Keys,
    redactor: Redactor,
    *,
    repeatable: bool = True,
    method: str = "DELETE",
) -> HttpResponse:
    credential = Credential(keys.read, keys.reject, redactor)
    return send_credentialed(
        transport, method, url, credential=credential, auth_header=api_key, repeatable=repeatable
    )


def test_401_repeats_once_with_the_renewed_credential(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, _ = keyed
    keys = Keys("old-key-0001", "good-key-0002")
    response = credentialed(transport, url, keys, redactor)
    assert response.status == 200
    assert keys.rejected == 1
    assert [r.headers["x-api-key"] for r in seen] == ["old-key-0001", "good-key-0002"]


def test_401_is_not_repeated_when_the_request_is_not_repeatable(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, _ = keyed
    keys = Keys("old-key-0001", "good-key-0002")
    response = credentialed(transport, url, keys, redactor, repeatable=False, method="POST")
    assert response.status == 401
    assert keys.rejected == 1
    assert len(seen) == 1


def test_401_is_not_repeated_when_no_renewed_credential_is_ready(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, _ = keyed
    keys = Keys("old-key-0001", "good-key-0002", renewed=False)
    assert credentialed(transport, url, keys, redactor).status == 401
    assert keys.rejected == 1
    assert len(seen) == 1


def test_a_second_401_is_reported_again_and_returned(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, _ = keyed
    keys = Keys("old-key-0001", "still-bad-0003")
    assert credentialed(transport, url, keys, redactor).status == 401
    assert keys.rejected == 2
    assert len(seen) == 2


def test_403_never_rejects_the_credential(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, statuses = keyed
    statuses["bad"] = 403
    keys = Keys("old-key-0001", "good-key-0002")
    assert credentialed(transport, url, keys, redactor).status == 403
    assert keys.rejected == 0
    assert len(seen) == 1


def test_no_credential_means_no_header_and_no_rejection(
    transport: Transport,
    redactor: Redactor,
    keyed: tuple[str, list[Request], dict[str, int]],
) -> None:
    url, seen, _ = keyed
    keys = Keys(None)
    assert credentialed(transport, url, keys, redactor).status == 401
    assert keys.rejected == 0
    assert "x-api-key" not in seen[0].headers
    assert "authorization" not in seen[0].headers


def test_a_failing_rejection_callback_counts_as_not_renewed(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, _ = keyed

    def broken() -> bool:
        raise RuntimeError("boom")

    credential = Credential(lambda: "old-key-0001", broken, redactor)
    response = send_credentialed(
        transport, "GET", url, credential=credential, auth_header=api_key, repeatable=True
    )
    assert response.status == 401
    assert len(seen) == 1


def test_a_sent_credential_is_registered_for_redaction(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, _, _ = keyed
    credentialed(transport, url, Keys("good-key-0002"), redactor).close()
    assert redactor.redact("key good-key-0002 here") == "key [REDACTED] here"


def test_credential_without_callbacks() -> None:
    credential = Credential(None, None, Redactor())
    assert credential.current() is None
    assert credential.reject() is False


# -- a credential that is required but missing --------------------------------------------


def test_an_unset_variable_is_credential_required_naming_it_before_any_request(
    transport: Transport, redactor: Redactor, keyed: tuple[str, list[Request], dict[str, int]]
) -> None:
    url, seen, _ = keyed
    environ: dict[str, str] = {}
    credential = Credential(lambda: environ["PISHIP_TEST_UNSET_KEY"], None, redactor)
    with pytest.raises(PiShipError) as caught:
        send_credentialed(
            transport, "GET", url, credential=credential, auth_header=api_key, repeatable=True
        )
    assert caught.value.code == CREDENTIAL_REQUIRED
    assert "PISHIP_TEST_UNSET_KEY is not set" in str(caught.value)
    assert "PISHIP_TEST_UNSET_KEY" in (caught.value.user_action or "")
    assert seen == []


def test_an_empty_credential_is_credential_required_naming_what_to_set(
    redactor: Redactor,
) -> None:
    credential = Credential(lambda: "", None, redactor, name="E2B_API_KEY")
    with pytest.raises(PiShipError) as caught:
        credential.current()
    assert caught.value.code == CREDENTIAL_REQUIRED
    assert "E2B_API_KEY is empty" in str(caught.value)
    assert (caught.value.user_action or "").startswith("Set E2B_API_KEY")


def test_a_failing_read_names_only_the_exception_type(redactor: Redactor) -> None:
    def broken() -> str:
        raise RuntimeError("vault said secret-value-0001")

    with pytest.raises(PiShipError) as caught:
        Credential(broken, None, redactor, name="E2B_API_KEY").current()
    assert caught.value.code == CREDENTIAL_REQUIRED
    assert "RuntimeError" in str(caught.value)
    assert "secret-value-0001" not in str(caught.value)
    assert caught.value.__suppress_context__


def test_a_string_credential_is_a_type_error_at_construction(redactor: Redactor) -> None:
    with pytest.raises(
        TypeError,
        match=r"credential must be a callable returning the key, "
        r"e\.g\. lambda: os\.environ\['E2B_API_KEY'\]",
    ):
        Credential(os.devnull, None, redactor)  # type: ignore[arg-type]


def test_a_non_callable_rejection_callback_is_a_type_error(redactor: Redactor) -> None:
    with pytest.raises(TypeError, match="credential_rejected must be a callable"):
        Credential(None, True, redactor)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", [None, ""])
def test_the_command_line_without_e2b_api_key_exits_2_naming_it_before_any_request(
    e2b_server: Callable[..., E2bServer], key: str | None
) -> None:
    mock = e2b_server(api_key="e2b_needed_key_0123456789")
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update({"PISHIP_E2B_ENDPOINT": mock.url, "PISHIP_E2B_ENVD_URL": mock.url})
    if key is not None:
        env["E2B_API_KEY"] = key
    result = subprocess.run(
        [sys.executable, "-m", "piship_remote", "run", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("CREDENTIAL_REQUIRED: ")
    assert "E2B_API_KEY is not set" in result.stderr
    assert "[REDACTED]" not in result.stderr
    assert mock.requests == []
