"""No secret in any frame: each fault-matrix error, rendered with its locals, holds none.

Error trackers, rich tracebacks and ``pytest --showlocals`` print every frame's
locals and the whole ``__cause__``/``__context__`` chain. For each cell of the
fault matrix whose faulted step raises, the error is rendered that way
(``traceback.TracebackException(capture_locals=True)``) and the text is swept for
every registered secret in every encoding the redactor knows (raw, base64 with and
without padding, base64url, percent-encoded, JSON-escaped); the frames of a
suppressed context (``raise ... from None``) are swept as well, as some error
trackers send it.
"""

from __future__ import annotations

import json
import traceback

import pytest
from reliability_support import API_KEY, BEARER, ENVD_TOKEN, attempt
from test_fault_matrix import (  # noqa: F401
    CELL_TIMEOUT,
    CELLS,
    PHASE,
    Harness,
    _file_step,
    expect,
    harness,
)

from piship_remote.model.redact import Redactor

pytestmark = pytest.mark.timeout(30)


def _error_cells() -> list[object]:
    cells = [cell for cell in CELLS if not expect(cell).ok and cell.request != "signal"]
    return [pytest.param(cell, id=cell.id) for cell in cells]


def rendered_with_locals(error: BaseException) -> str:
    """The traceback as a locals-printing tool shows it, chained causes and contexts included."""
    return "".join(traceback.TracebackException.from_exception(error, capture_locals=True).format())


# The credentials the library holds and registers with its redactor. (The host
# environment passed to activate_sandbox is the caller's own data, not swept here.)
REGISTERED = (API_KEY, BEARER, ENVD_TOKEN)


def secret_forms_in(text: str) -> list[str]:
    """Each registered secret found in ``text`` in any of its encodings."""
    found = []
    for secret in REGISTERED:
        redactor = Redactor()
        redactor.register(secret)
        if redactor.appears_in(text):
            found.append(secret)
    return found


def leaking_frames(error: BaseException) -> list[str]:
    """``file:line in function: local`` for every frame local that holds a secret."""
    leaks = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        summary = traceback.TracebackException.from_exception(
            current, capture_locals=True, lookup_lines=False
        )
        for frame in summary.stack:
            for name, value in (frame.locals or {}).items():
                if secret_forms_in(value):
                    leaks.append(f"{frame.filename}:{frame.lineno} in {frame.name}: {name}")
        current = current.__cause__ or current.__context__
    return leaks


def _faulted_step(h: Harness) -> BaseException | None:
    h.make_backend()
    phase = PHASE[h.cell.request]
    if phase == "activate":
        h.inject()
        return attempt(h.activate).error
    sandbox = h.activate()
    step = _file_step(sandbox, h.cell.request, h.workspace) if phase == "files" else None
    try:
        h.inject()
        if phase == "exec":
            timeout = CELL_TIMEOUT.get(h.cell.request, {}).get(h.cell.fault)
            return attempt(lambda: sandbox.exec(f"deploy-{h.cell.id}", timeout=timeout)).error
        if phase == "files":
            return attempt(step).error
        return attempt(sandbox.dispose).error
    finally:
        h.restore()
        sandbox.dispose()


@pytest.mark.parametrize("harness", _error_cells(), indirect=True)
def test_an_error_rendered_with_its_locals_holds_no_secret(harness: Harness) -> None:  # noqa: F811
    error = _faulted_step(harness)
    assert error is not None, f"{harness.cell.id}: the faulted step did not fail"
    text = rendered_with_locals(error)
    assert secret_forms_in(text) == [], "\n".join(leaking_frames(error))
    assert leaking_frames(error) == []


def test_the_sweep_finds_a_secret_in_a_local_and_in_the_context() -> None:
    def fail(token: str) -> None:
        try:
            raise OSError("connection reset")
        except OSError:
            raise RuntimeError("the request failed") from None

    api_key, bearer = API_KEY, BEARER
    try:
        fail(api_key)
    except RuntimeError as error:
        assert api_key in secret_forms_in(rendered_with_locals(error))
        assert any(line.endswith(" in fail: token") for line in leaking_frames(error))
    held = {"authorization": f"Bearer {bearer}"}
    try:
        try:
            raise OSError(str(held))
        except OSError:
            raise RuntimeError("the request failed")  # noqa: B904
    except RuntimeError as error:
        assert bearer in secret_forms_in(rendered_with_locals(error))


def test_the_sweep_finds_a_secret_in_a_suppressed_context() -> None:
    def decode(body: str) -> object:
        return json.loads(body)

    def read() -> None:
        try:
            decode(f"not JSON: {BEARER}")
        except ValueError:
            raise RuntimeError("the answer could not be read") from None

    try:
        read()
    except RuntimeError as error:
        assert secret_forms_in(rendered_with_locals(error)) == []
        assert any(line.endswith(" in decode: body") for line in leaking_frames(error))
