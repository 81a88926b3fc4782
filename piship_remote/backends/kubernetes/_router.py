"""The sandbox router: one ``POST /execute`` per command, its answer read whole.

The router forwards to the runtime in the claimed sandbox (by the
``X-Sandbox-*`` headers) and answers ``{"stdout", "stderr", "exit_code"}`` once
the command ended::

    router = Router(http, router_url, namespace="agents", port=8888)
    answer = router.execute(claim, runtime_command(request, workdir), cancel)

Three kinds of failure are told apart: what never ran (the router could not
connect to the sandbox, the runtime could not spawn the command), what ran but
could not report (the runtime's own timeout, output that is not UTF-8), and what
may have run (a dropped connection, any other 5xx). A command whose outcome is
unknown is never re-sent: :class:`Retire` says its claim must not run another one.
The router runs commands without a shell, so :func:`runtime_command` wraps each one
in ``env … /bin/sh -c``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from piship_remote.backends._common import (
    DETAIL_LIMIT,
    exit_code_of,
    is_success,
    remote_directory,
)
from piship_remote.backends.base import ExecRequest
from piship_remote.backends.kubernetes._http import ClusterHttp
from piship_remote.backends.kubernetes._port_forward import TUNNEL_FAILED
from piship_remote.backends.kubernetes.claims import Claim
from piship_remote.model.errors import PiShipError
from piship_remote.transport import TransportError
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline

__all__ = [
    "TIMEOUT_SLACK",
    "Retire",
    "Router",
    "RouterAnswer",
    "runtime_command",
    "runtime_failure",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ROUTER_LIMIT = 16 * 1024 * 1024
# The runtime reports each of its own failures as HTTP 200, exit 1, no stdout and a
# one-line stderr (an exception's text, never newline-terminated) with this prefix; a
# command's own stderr ends with a newline, or comes with stdout.
_START_FAILURE = "Failed to execute command: "
_RUNTIME_TIMEOUT = re.compile(r"^Command '\[.*\]' timed out after (?P<seconds>[0-9.]+) seconds$")
_UNDECODABLE = re.compile(r"codec can't decode")
# The router's 502 when it could not open a connection to the sandbox at all.
_NOT_CONNECTED = "Could not connect to the backend sandbox"
# Added to a command's timeout for the router, so the client's own deadline acts first.
TIMEOUT_SLACK = 5.0
_OUTCOME_UNKNOWN = (
    "The command's outcome is unknown: {reason} before its result arrived. It may have run "
    "in part or in full, or still be running; piship_remote retired its sandbox, which is deleted "
    "once no other command runs in it, and runs the next command in a new one. Check the "
    "command's effects before running it again"
)


def runtime_command(request: ExecRequest, workdir: str | None) -> str:
    """The router command for ``request``: ``env 'K=V' … /bin/sh -c '<cd && command>'``.

    The runtime splits the string like a POSIX shell but runs no shell, hence the
    explicit ``/bin/sh -c``. Environment names that are not shell names are dropped.

    >>> print(runtime_command(ExecRequest("ls", "/ws", "a/b", {"A": "x y"}), "/workspace"))
    env 'A=x y' /bin/sh -c 'cd -- '"'"'/workspace/a/b'"'"' && ls'
    """
    directory = remote_directory(workdir, request.workspace_path)
    script = (
        request.command if directory is None else f"cd -- {_quote(directory)} && {request.command}"
    )
    assignments = [
        _quote(f"{name}={value}")
        for name, value in request.env.items()
        if _ENV_NAME.fullmatch(name)
    ]
    return " ".join(["env", *assignments, "/bin/sh", "-c", _quote(script)])


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


class Retire(Exception):
    """A router outcome after which the claim must not run another command.

    ``unreached``: the router could not reach the sandbox, so the command never started.
    """

    def __init__(self, error: PiShipError, *, gone: bool, unreached: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.gone = gone
        self.unreached = unreached


@attrs.frozen
class RouterAnswer:
    """What the router said a command printed and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None


class Router:
    """``POST {router}/execute`` for the sandboxes of one namespace."""

    def __init__(
        self, http: ClusterHttp, router: str, *, namespace: str, port: int, scoped: bool = False
    ) -> None:
        self._http = http
        self._execute_url = f"{router}/execute"
        self._namespace = namespace
        self._port = port
        self._scoped = scoped

    def headers(self, claim: Claim) -> dict[str, str]:
        """The routing headers for ``claim``'s sandbox.

        The pod's address and the Sandbox's UID let the router skip DNS (warm-pool
        sandboxes have no Service); a router checking scoped tokens refuses both, since
        either would pick a pod other than the one its token names.
        """
        headers = {
            "X-Sandbox-ID": claim.sandbox,
            "X-Sandbox-Namespace": self._namespace,
            "X-Sandbox-Port": str(self._port),
        }
        if self._scoped:
            return headers
        if claim.pod_ip is not None:
            headers["X-Sandbox-Pod-IP"] = claim.pod_ip
        if claim.uid is not None:
            headers["X-Sandbox-UID"] = claim.uid
        return headers

    def execute(
        self,
        claim: Claim,
        command: str,
        cancel: CancelToken,
        deadline: Deadline | None = None,
        *,
        read_timeout: float | None = None,
    ) -> RouterAnswer:
        """Run ``command`` once. Raises :class:`Retire` when the claim must not be reused.

        With a ``deadline`` the router is told (``X-Sandbox-Timeout``) to give up a few
        seconds after what is left of it, so a lost client cannot hold the request open
        for ever. ``read_timeout`` bounds this client's own wait (None: the command's end).
        """
        headers = self.headers(claim)
        bound: dict[str, Any] = {"timeout": read_timeout}
        if deadline is not None and deadline.bounded:
            left = deadline.remaining() or 0.0
            headers["X-Sandbox-Timeout"] = str(math.ceil(left + TIMEOUT_SLACK))
            if read_timeout is None:
                bound = {"deadline": deadline.later(TIMEOUT_SLACK)}  # the router's, as told
        try:
            response = self._http.call(
                "POST",
                self._execute_url,
                cancel=cancel,
                headers=headers,
                json={"command": command},
                stream=True,
                **bound,
            )
        except TransportError as error:
            if not error.request_sent:
                raise self._http.errors(
                    f"the sandbox router is unreachable, so the command was not sent: {error}",
                    retryable=True,
                    not_started=True,
                ) from None
            raise self._unknown(f"the connection to the sandbox router failed ({error})") from None
        with response:
            if response.status == 502 and response.headers.get(TUNNEL_FAILED):
                raise self._http.errors(
                    "the sandbox router is unreachable, so the command was not sent: "
                    f"{self._http.failure(response)}",
                    retryable=True,
                    not_started=True,
                )
            if response.status == 404:
                raise Retire(
                    self._http.errors(
                        "the sandbox router no longer knows this sandbox", not_started=True
                    ),
                    gone=True,
                    unreached=True,
                )
            if response.status >= 500:
                failure = self._http.failure(response)
                if response.status == 502 and _NOT_CONNECTED in failure:
                    raise Retire(
                        self._http.errors(
                            "the sandbox router could not connect to the sandbox, so the "
                            f"command did not run ({failure}); the next command runs "
                            "in a new sandbox",
                            retryable=True,
                        ),
                        gone=True,
                        unreached=True,
                    )
                raise self._unknown(f"the sandbox router answered {failure}")
            if not is_success(response.status):
                raise self._http.errors(
                    f"running the command failed: {self._http.failure(response)}",
                    user_action=self._http.advice(response),
                )
            try:
                answer = response.json_object(_ROUTER_LIMIT)
            except TransportError as error:
                raise self._unknown(
                    f"the connection to the sandbox router failed ({error})"
                ) from None
            except ValueError as error:
                raise self._http.errors(
                    f"the sandbox router's answer could not be read ({error}); "
                    "the command ran, but its result is unknown"
                ) from None
        return self._answer(answer)

    def _answer(self, answer: Mapping[str, Any]) -> RouterAnswer:
        stdout, stderr = answer.get("stdout"), answer.get("stderr")
        exit_code = exit_code_of(answer.get("exit_code"))
        result = RouterAnswer(
            stdout if isinstance(stdout, str) else "",
            stderr if isinstance(stderr, str) else "",
            128 - exit_code if exit_code is not None and exit_code < 0 else exit_code,
        )
        failure = runtime_failure(result)
        if failure is None:
            return result
        detail = " ".join(result.stderr.split())[:DETAIL_LIMIT]
        timed_out = _RUNTIME_TIMEOUT.match(failure)
        if timed_out is not None:
            raise self._http.errors(
                "the command ran, but the sandbox runtime stopped it at its own limit of "
                f"{timed_out['seconds']} seconds and kept none of its output; its effects "
                "up to then happened"
            )
        if _UNDECODABLE.search(failure):
            raise self._http.errors(
                "the command ran, but its output is not UTF-8 text, which the sandbox "
                f"runtime cannot return, so its output and exit code are lost: {detail}"
            )
        raise self._http.errors(f"the sandbox runtime could not run the command: {detail}")

    def _unknown(self, reason: str) -> Retire:
        """The command may have run: never retryable, and its claim is retired."""
        return Retire(self._http.errors(_OUTCOME_UNKNOWN.format(reason=reason)), gone=False)


def runtime_failure(answer: RouterAnswer) -> str | None:
    """The runtime's own failure text (after its prefix), or None for a command's result.

    >>> runtime_failure(RouterAnswer("", "Failed to execute command: No closing quotation", 1))
    'No closing quotation'
    >>> runtime_failure(RouterAnswer("", "Failed to execute command: oops\\n", 1)) is None
    True
    """
    stderr = answer.stderr
    if answer.exit_code != 1 or answer.stdout or not stderr.startswith(_START_FAILURE):
        return None
    if "\n" in stderr:
        return None
    return stderr[len(_START_FAILURE) :]
