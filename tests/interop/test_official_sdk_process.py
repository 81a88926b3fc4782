"""The official E2B Python SDK's command and PTY calls against ``LocalE2bService``.

stdin, connect, list, PTY create/input/resize/kill and ``cwd`` outside the home,
each as a user of the SDK writes it. The SDK is pointed at loopback with
``api_url`` and ``sandbox_url``; nothing leaves the machine.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import AuthenticationException, CommandExitException, NotFoundException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

WAIT = 20.0


@pytest.fixture(scope="module")
def service() -> Iterator[object]:
    with local_e2b_service() as service:
        yield service


@pytest.fixture
def sandbox(service: object) -> Iterator[Sandbox]:
    url, key = service.url, service.api_key  # type: ignore[attr-defined]
    sandbox = Sandbox.create(api_key=key, api_url=url, sandbox_url=url, request_timeout=10)
    yield sandbox
    sandbox.kill()


class PtyOutput:
    """What a PTY printed, gathered on a thread; ``wait_for`` blocks until a text appears."""

    def __init__(self) -> None:
        self.data = b""
        self._changed = threading.Condition()

    def add(self, chunk: bytes) -> None:
        with self._changed:
            self.data += chunk
            self._changed.notify_all()

    def wait_for(self, text: bytes) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: text in self.data, WAIT)


def _follow(handle: object) -> PtyOutput:
    output = PtyOutput()

    def read() -> None:
        try:
            handle.wait(on_pty=output.add)  # type: ignore[attr-defined]
        except CommandExitException:
            pass

    threading.Thread(target=read, name="piship-test-pty", daemon=True).start()
    return output


def test_send_stdin_reaches_a_background_command(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("read line; echo got:$line", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello\n")
    assert handle.wait().stdout == "got:hello\n"


def test_close_stdin_ends_a_command_reading_to_eof(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat; echo done", background=True, stdin=True)
    handle.send_stdin("a\nb\n")
    handle.close_stdin()
    assert handle.wait().stdout == "a\nb\ndone\n"


def test_a_command_without_stdin_reads_end_of_file(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("cat; echo eof").stdout == "eof\n"


def test_connect_follows_a_running_command_to_its_end(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("read x; echo after:$x", background=True, stdin=True)
    attached = sandbox.commands.connect(handle.pid)
    sandbox.commands.send_stdin(handle.pid, "go\n")
    assert attached.wait().stdout == "after:go\n"
    handle.wait()


def test_connect_to_an_unknown_pid_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999999)


def test_send_stdin_to_an_unknown_pid_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(999999, "x")


def test_list_shows_a_running_command_with_its_config_and_tag(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True, envs={"A": "1"}, cwd="/tmp")
    listed = {p.pid: p for p in sandbox.commands.list()}
    handle.kill()
    info = listed[handle.pid]
    assert (info.cmd, info.args, info.envs, info.cwd) == (
        "/bin/bash",
        ["-l", "-c", "sleep 30"],
        {"A": "1"},
        "/tmp",
    )


def test_kill_ends_a_background_command_and_it_leaves_the_list(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as raised:
        handle.wait()
    assert (raised.value.exit_code, raised.value.error) == (-1, "signal: killed")
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]


def test_a_cwd_outside_the_home_is_used(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.commands.run("pwd", cwd="/").stdout == "/\n"


def test_an_unknown_user_is_refused_as_authentication(sandbox: Sandbox) -> None:
    with pytest.raises(AuthenticationException, match="invalid username"):
        sandbox.commands.run("id", user="mallory")  # type: ignore[arg-type]


needs_host_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the local service maps a root beside the user only as host root"
)


@needs_host_root
def test_user_root_runs_commands_as_uid_0_in_root_home(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"
    assert sandbox.commands.run('pwd; echo "$HOME"', user="root").stdout == "/root\n/root\n"
    assert sandbox.commands.run("id -u").stdout == "1000\n"


@needs_host_root
def test_files_as_root_are_written_and_read_in_root_home(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/root/sdk.txt", "from the sdk", user="root")
    assert info.path == "/root/sdk.txt"
    assert sandbox.files.read("/root/sdk.txt", user="root") == "from the sdk"
    assert sandbox.commands.run("stat -c %U /root/sdk.txt", user="root").stdout == "root\n"


def test_pty_create_runs_an_interactive_shell_on_a_terminal(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    output = _follow(terminal)
    sandbox.pty.send_stdin(terminal.pid, b"tty; stty size; echo $TERM\n")
    assert output.wait_for(b"24 80")
    assert b"/dev/pts/" in output.data
    assert output.wait_for(b"xterm-256color")
    sandbox.pty.kill(terminal.pid)


def test_pty_resize_changes_the_terminal_size(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    output = _follow(terminal)
    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(terminal.pid, b"stty size\n")
    assert output.wait_for(b"40 120")
    sandbox.pty.kill(terminal.pid)


def test_pty_exit_ends_the_handle_with_the_shells_status(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"exit 3\n")
    with pytest.raises(CommandExitException) as raised:
        terminal.wait(on_pty=lambda _: None)
    assert raised.value.exit_code == 3


def test_pty_kill_ends_the_terminal(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    assert sandbox.pty.kill(terminal.pid) is True
    with pytest.raises(CommandExitException) as raised:
        terminal.wait(on_pty=lambda _: None)
    assert raised.value.error == "signal: killed"
    assert sandbox.pty.kill(terminal.pid) is False


def test_pty_connect_attaches_to_a_running_terminal(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    attached = _follow(sandbox.pty.connect(terminal.pid))
    sandbox.pty.send_stdin(terminal.pid, b"echo at-$((6*7))\n")
    assert attached.wait_for(b"at-42")
    sandbox.pty.kill(terminal.pid)


def test_stream_input_feeds_a_command_in_order(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("head -n 2", background=True, stdin=True)
    sandbox.commands.stream_input(handle.pid, iter(["one\n", b"two\n"]))
    assert handle.wait().stdout == "one\ntwo\n"


def test_create_envs_reach_every_command(service: object) -> None:
    url, key = service.url, service.api_key  # type: ignore[attr-defined]
    sandbox = Sandbox.create(
        api_key=key, api_url=url, sandbox_url=url, request_timeout=10, envs={"GREETING": "hi"}
    )
    try:
        assert sandbox.commands.run('echo "$GREETING"').stdout == "hi\n"
    finally:
        sandbox.kill()


def test_a_sandbox_created_without_internet_has_loopback_only(service: object) -> None:
    url, key = service.url, service.api_key  # type: ignore[attr-defined]
    sandbox = Sandbox.create(
        api_key=key, api_url=url, sandbox_url=url, request_timeout=10, allow_internet_access=False
    )
    try:
        links = sandbox.commands.run("ip -o link").stdout
        assert "1: lo:" in links and "tap0" not in links
    finally:
        sandbox.kill()
