"""The sandbox router: one ``POST /execute`` per command, its answer read whole.

The router forwards to the runtime in the claimed sandbox (by the
``X-Sandbox-*`` headers) and answers ``{"stdout", "stderr", "exit_code"}`` once
the command ended::

    router = Router(http, router_url, namespace="agents", port=8888)
    answer = router.execute(claim, runtime_command(request, workdir), cancel)

A command whose outcome the router cannot tell (dropped connection, 5xx) is
never re-sent: :class:`Retire` says its claim must not run another command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from piship_remote.backends.claims import Claim
from piship_remote.backends.common import DETAIL_LIMIT, exit_code_of, is_success
from piship_remote.backends.kubernetes_http import ClusterHttp
from piship_remote.cancel import CancelToken
from piship_remote.errors import PiShipError
from piship_remote.transport import TransportError

__all__ = ["Retire", "Router", "RouterAnswer"]

_ROUTER_LIMIT = 16 * 1024 * 1024
# The runtime reports every failure to start (and its own timeout) as exit 1 with this.
_START_FAILURE = "Failed to execute command:"
_OUTCOME_UNKNOWN = (
    "The command's outcome is unknown: {reason} before its result arrived. It may have run "
    "in part or in full, or still be running; PiShip retired its sandbox, which is deleted "
    "once no other command runs in it, and runs the next command in a new one. Check the "
    "command's effects before running it again"
)


class Retire(Exception):
    """A router outcome after which the claim must not run another command."""

    def __init__(self, error: PiShipError, *, gone: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.gone = gone


@attrs.frozen
class RouterAnswer:
    """What the router said a command printed and how it ended."""

    stdout: str
    stderr: str
    exit_code: int | None


class Router:
    """``POST {router}/execute`` for the sandboxes of one namespace."""

    def __init__(self, http: ClusterHttp, router: str, *, namespace: str, port: int) -> None:
        self._http = http
        self._execute_url = f"{router}/execute"
        self._namespace = namespace
        self._port = port

    def execute(self, claim: Claim, command: str, cancel: CancelToken) -> RouterAnswer:
        """Run ``command`` once. Raises :class:`Retire` when the claim must not be reused."""
        headers = {
            "X-Sandbox-ID": claim.sandbox,
            "X-Sandbox-Namespace": self._namespace,
            "X-Sandbox-Port": str(self._port),
        }
        if claim.pod_ip is not None:
            headers["X-Sandbox-Pod-IP"] = claim.pod_ip
        try:
            response = self._http.call(
                "POST",
                self._execute_url,
                cancel=cancel,
                headers=headers,
                json={"command": command},
                timeout=None,
                stream=True,
            )
        except TransportError as error:
            if not error.request_sent:
                raise self._http.errors(
                    f"the sandbox router is unreachable, so the command was not sent: {error}",
                    retryable=True,
                ) from None
            raise self._unknown(f"the connection to the sandbox router failed ({error})") from None
        with response:
            if response.status == 404:
                raise Retire(
                    self._http.errors("the sandbox router no longer knows this sandbox"), gone=True
                )
            if response.status >= 500:
                raise self._unknown(f"the sandbox router answered {self._http.failure(response)}")
            if not is_success(response.status):
                raise self._http.errors(
                    f"running the command failed: {self._http.failure(response)}"
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
        result = RouterAnswer(
            stdout if isinstance(stdout, str) else "",
            stderr if isinstance(stderr, str) else "",
            exit_code_of(answer.get("exit_code")),
        )
        if result.exit_code == 1 and result.stderr.startswith(_START_FAILURE):
            detail = " ".join(result.stderr.split())[:DETAIL_LIMIT]
            raise self._http.errors(f"the sandbox runtime could not run the command: {detail}")
        return result

    def _unknown(self, reason: str) -> Retire:
        """The command may have run: never retryable, and its claim is retired."""
        return Retire(self._http.errors(_OUTCOME_UNKNOWN.format(reason=reason)), gone=False)
