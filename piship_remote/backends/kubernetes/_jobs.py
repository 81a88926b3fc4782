"""Detached commands on the runtime's unary ``/execute``: launch, poll, kill.

A router ends any request after its proxy limit (180 s by default) and the runtime
returns output only once a command ended, so a long command run directly turns
into "outcome unknown". In detached mode the command runs in the background in
the sandbox, in its own session and process group (``setsid``), with its output
and exit status kept in a per-job directory named by a client-chosen id; short
``/execute`` calls then read what is new::

    jobs = DetachedJobs(router)
    exit_code = jobs.run(claim, runtime_command(request, workdir), cancel, on_stdout, on_stderr)

Every call is idempotent. The launch creates the job directory with ``mkdir``, so
a second launch of the same id never starts it twice; a launch whose answer was
lost is resolved by looking for that directory. A dropped poll is simply polled
again: the files say what happened. Cancelling kills the process group and keeps
the sandbox usable.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.base import OutputCallback
from piship_remote.backends.kubernetes._router import Retire, Router
from piship_remote.backends.kubernetes.claims import Claim
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline

__all__ = ["DetachedJobs", "job_script"]

# Bytes of each stream one poll returns; a poll reads at most twice this, base64-coded.
CHUNK = 1024 * 1024
# How long one job call may take at the router, and this client's wait for it.
_CALL_TIMEOUT = 20.0
_READ_TIMEOUT = 40.0
_FIRST_POLL = 0.05
_SLOWEST_POLL = 1.0
# Consecutive failed job calls after which the job's fate is unknown.
_FAILURES = 6
_STARTED = "piship-job-started"
_EXISTS = "piship-job-exists"
_MISSING = "piship-job-missing"
_PRESENT = "piship-job-present"
_OUTCOME_UNKNOWN = (
    "The command's outcome is unknown: {reason}. It may have run in part or in full, or "
    "still be running; piship_remote retired its sandbox, which is deleted once no other command "
    "runs in it, and runs the next command in a new one. Check the command's effects "
    "before running it again"
)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _shell(script: str) -> str:
    """A runtime command (split like a shell, run without one) that runs ``script``."""
    return f"/bin/sh -c {_quote(script)}"


def _directory(job: str) -> str:
    return f'd="${{TMPDIR:-/tmp}}/piship-jobs/{job}"'


def job_script(job: str, command: str) -> str:
    """The launch script: create the job directory (once) and start ``command`` detached.

    The job writes its process group id, then the command's output to ``out``/``err``
    and, once it ended, its exit status (128+n for signal n) to ``status``.
    """
    body = (
        'd=$1; echo $$ > "$d/pid" || exit 0; [ -e "$d/cancel" ] && exit 0; '
        f'{command} < /dev/null > "$d/out" 2> "$d/err"; '
        'echo $? > "$d/status.tmp" && mv "$d/status.tmp" "$d/status"'
    )
    return (
        f'{_directory(job)}; mkdir -p "${{d%/*}}" && mkdir "$d" 2>/dev/null '
        f"|| {{ echo {_EXISTS}; exit 0; }}; "
        f'setsid /bin/sh -c {_quote(body)} piship-job "$d" < /dev/null > /dev/null 2>&1 & '
        f"echo {_STARTED}"
    )


def _poll_script(job: str, out: int, err: int) -> str:
    """Status first, then what is new: complete output once a status is there."""

    def chunk(name: str, offset: int) -> str:
        return (
            f'"$(tail -c +{offset + 1} "$d/{name}" 2>/dev/null | head -c {CHUNK} '
            "| base64 | tr -d '\\n')\""
        )

    return (
        f'{_directory(job)}; [ -d "$d" ] || {{ echo {_MISSING}; exit 0; }}; '
        's=$(cat "$d/status" 2>/dev/null); '
        f'printf "status:%s\\nout:%s\\nerr:%s\\n" "$s" {chunk("out", out)} {chunk("err", err)}'
    )


def _kill_script(job: str) -> str:
    return (
        f'{_directory(job)}; [ -d "$d" ] || exit 0; touch "$d/cancel"; i=0; '
        'while [ ! -s "$d/pid" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done; '
        '[ -s "$d/pid" ] && kill -s KILL -- "-$(cat "$d/pid")" 2>/dev/null; rm -rf "$d"'
    )


def _exists_script(job: str) -> str:
    return f'{_directory(job)}; [ -d "$d" ] && echo {_PRESENT} || echo {_MISSING}'


def _remove_script(job: str) -> str:
    return f'{_directory(job)}; rm -rf "$d"'


class DetachedJobs:
    """Runs commands as background jobs in a claim's sandbox through ``router``."""

    def __init__(self, router: Router, errors: SandboxErrors) -> None:
        self._router = router
        self._errors = errors

    def run(
        self,
        claim: Claim,
        command: str,
        cancel: CancelToken,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> int | None:
        """The command's exit code, its output streamed as it grows.

        Raises ``CommandCancelled`` (the job's process group killed, the sandbox
        kept), :class:`Retire` when the job's fate cannot be learned, and
        ``PiShipError`` when it could not be started.
        """
        job = secrets.token_hex(8)
        try:
            self._launch(claim, job, command, cancel)
            code = self._follow(claim, job, cancel, on_stdout, on_stderr)
        except CommandCancelled:
            self._quietly(claim, _kill_script(job))
            raise
        self._quietly(claim, _remove_script(job))
        return code

    def _launch(self, claim: Claim, job: str, command: str, cancel: CancelToken) -> None:
        script = _shell(job_script(job, command))
        for _ in range(_FAILURES):
            try:
                said = self._call(claim, script, cancel)
            except Retire as lost:
                if lost.gone:  # the router could not reach the sandbox: nothing started
                    raise
                if self._job_exists(claim, job, cancel):
                    return
                if cancel.wait(_SLOWEST_POLL):
                    raise CommandCancelled() from None
                continue  # not started: launching again cannot start it twice
            if said not in (_STARTED, _EXISTS):
                raise self._errors(f"starting the detached command failed: {said[:200]!r}")
            return
        raise self._unknown("its launch got no answer")

    def _job_exists(self, claim: Claim, job: str, cancel: CancelToken) -> bool:
        for _ in range(_FAILURES):
            try:
                return self._call(claim, _shell(_exists_script(job)), cancel) == _PRESENT
            except (Retire, PiShipError):
                if cancel.wait(_SLOWEST_POLL):
                    raise CommandCancelled() from None
        raise self._unknown("whether its launch arrived could not be learned")

    def _follow(
        self,
        claim: Claim,
        job: str,
        cancel: CancelToken,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> int | None:
        offsets = [0, 0]
        interval = _FIRST_POLL
        failures = 0
        while True:
            try:
                said = self._call(claim, _shell(_poll_script(job, *offsets)), cancel)
            except (Retire, PiShipError) as error:
                failures += 1
                if failures >= _FAILURES:
                    raise self._unknown(f"polling it kept failing ({error})") from None
                said = None
            if said is not None:
                failures = 0
                status, out, err = self._parse(said)
                for index, (chunk, sink) in enumerate(((out, on_stdout), (err, on_stderr))):
                    offsets[index] += len(chunk)
                    if chunk and sink is not None:
                        sink(chunk)
                if status is not None and len(out) < CHUNK and len(err) < CHUNK:
                    return status
                interval = _FIRST_POLL if out or err else min(interval * 2, _SLOWEST_POLL)
            if cancel.wait(interval):
                raise CommandCancelled()

    def _parse(self, said: str) -> tuple[int | None, bytes, bytes]:
        """``(exit status or None while running, new stdout, new stderr)``."""
        if said == _MISSING:
            raise self._errors("the detached command's job directory disappeared in the sandbox")
        fields: dict[str, str] = {}
        for line in said.splitlines():
            key, _, value = line.partition(":")
            fields[key] = value
        try:
            out = base64.b64decode(fields.get("out", ""))
            err = base64.b64decode(fields.get("err", ""))
        except (binascii.Error, ValueError):
            raise self._errors("the detached command's output could not be read") from None
        status = fields.get("status", "").strip()
        return (int(status) if status.isdigit() else None), out, err

    def _call(self, claim: Claim, script: str, cancel: CancelToken) -> str:
        answer = self._router.execute(
            claim, script, cancel, Deadline.after(_CALL_TIMEOUT), read_timeout=_READ_TIMEOUT
        )
        if answer.exit_code != 0:
            raise self._errors(
                f"a detached-command call exited {answer.exit_code}: {answer.stderr[:200]!r}"
            )
        return answer.stdout.strip()

    def _quietly(self, claim: Claim, script: str) -> None:
        """Best effort (killing, cleaning up): a failure leaves it to the claim's end."""
        try:
            self._call(claim, _shell(script), CancelToken())
        except (Retire, PiShipError, CommandCancelled):
            pass

    def _unknown(self, reason: str) -> Retire:
        return Retire(self._errors(_OUTCOME_UNKNOWN.format(reason=reason)), gone=False)
