"""A running command's input through envd: SendInput, CloseStdin, and Update for its terminal.

:class:`EnvdInput` is what an E2B instance binds to a request's
:class:`~piship_remote.backends.control.CommandControl` once the command started; its
calls run on the handle's caller's thread, each cancelled with the command.
"""

from __future__ import annotations

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.control import TerminalSize
from piship_remote.backends.e2b._envd import Envd
from piship_remote.model.errors import COMMAND_FAILED, PiShipError
from piship_remote.transport._cancel import CancelToken

__all__ = ["END_OF_TRANSMISSION", "EnvdInput"]

END_OF_TRANSMISSION = b"\x04"  # what a terminal reads as the end of input (Ctrl-D)


class EnvdInput:
    """The input of the command tagged ``tag``; ``terminal``: it runs on a pty."""

    def __init__(
        self, envd: Envd, tag: str, token: CancelToken, errors: SandboxErrors, *, terminal: bool
    ) -> None:
        self._envd = envd
        self._tag = tag
        self._token = token
        self._errors = errors
        self._terminal = terminal

    def send(self, data: bytes) -> None:
        if data and not self._envd.send_input(self._tag, data, self._token, pty=self._terminal):
            raise self._refused("its input")

    def close(self) -> None:
        if self._terminal:
            self.send(END_OF_TRANSMISSION)
        elif not self._envd.close_stdin(self._tag, self._token):
            raise self._refused("closing its input")

    def resize(self, size: TerminalSize) -> None:
        if not self._envd.resize(self._tag, size, self._token):
            raise self._refused("resizing its terminal")

    def _refused(self, what: str) -> PiShipError:
        return self._errors(
            f"the sandbox refused {what}: the command ended or closed its input",
            code=COMMAND_FAILED,
        )
