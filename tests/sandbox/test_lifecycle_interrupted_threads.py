"""Ctrl-C in a script whose commands run on a ThreadPoolExecutor's worker threads.

The script (a temporary file run with ``sys.executable``) starts four commands on a
pool (or on plain threads). SIGINT raises ``KeyboardInterrupt`` on the main thread; the
process must then end within seconds, the commands killed and the sandbox deleted,
instead of Python waiting for the workers' commands. When the interrupt ends the script
(``future.result()`` or ``thread.join()`` outside a block, or Ctrl-C while the block's end
waits), the library's shutdown hook disposes. Ctrl-C while the main thread waits *inside*
``with ThreadPoolExecutor()`` (or before a ``shutdown()`` in ``finally``) leaves the
main thread waiting for the workers, and the library's ``piship-interrupt-watch`` thread
disposes; with ``cleanup_on_signals([SIGINT])`` the signal handler does it first, and a
second Ctrl-C during the disposal changes nothing. On the Kubernetes agent-sandbox double
the same Ctrl-C inside the block deletes the claim.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote.testing import E2bServer, KubernetesServer

REPO = Path(__file__).resolve().parents[2]
API_KEY = "e2b_threads0123456789"
COMMANDS = 4
SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import piship_remote
    from piship_remote import activate_sandbox
    from piship_remote.backends.e2b.backend import E2bCompatibleBackend

    url, key, form, kind = sys.argv[1:5]
    if form == "with-block":
        piship_remote.cleanup_on_signals([signal.SIGINT, signal.SIGTERM])
    elif form == "with-block-twice":

        def interrupted(number, frame):  # Python's own handler, plus a line to wait for
            print("interrupted", flush=True)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupted)
    if kind == "k8s":
        from tests.support.lifecycle_child import backend as kubernetes

        backend, network = kubernetes("k8s", url, 3600.0), "allow"
    else:
        backend = E2bCompatibleBackend(endpoint=url, envd_url=url, credential=lambda: key)
        network = "deny"
    sandbox = activate_sandbox(
        {"required": True, "network": {"mode": network}}, backend=backend, workspace="."
    )

    def run_all(pool):
        futures = [pool.submit(sandbox.exec, "sleep 30") for _ in range(COMMANDS)]
        for future in futures:
            future.result()

    if form in ("with-block", "with-block-twice", "with-block-once"):
        with ThreadPoolExecutor(COMMANDS) as pool:
            run_all(pool)
    elif form == "shutdown-in-finally":
        pool = ThreadPoolExecutor(COMMANDS)
        try:
            run_all(pool)
        finally:
            pool.shutdown(wait=True)
    elif form == "threads":
        threads = [
            threading.Thread(target=sandbox.exec, args=("sleep 30",)) for _ in range(COMMANDS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif form == "with-exit":
        with ThreadPoolExecutor(COMMANDS) as pool:
            for _ in range(COMMANDS):
                pool.submit(sandbox.exec, "sleep 30")
    else:
        run_all(ThreadPoolExecutor(COMMANDS))
    print("not reached", flush=True)
    """
).replace("COMMANDS", str(COMMANDS))
PROMPT_EXIT = 5.0  # seconds from SIGINT to the process's end


def holding(started: threading.Semaphore) -> Callable[[Any], dict[str, Any]]:
    """Hold every ``sleep`` command (until the client goes away), counting them in."""

    def answer(command: Any) -> dict[str, Any]:
        text = command["process"]["args"][2] if isinstance(command, dict) else command
        if "sleep 30" not in text:
            return {"stdout": "", "exit_code": 0}
        started.release()
        return {"hang": True}

    return answer


def press_again_until_it_ends(process: subprocess.Popen[str], presses: int = 10) -> None:
    """Ctrl-C again, as a user would, every half second until ``process`` ends.

    One that lands while Python still handles the first merges with it.
    """
    for _ in range(presses):
        process.send_signal(signal.SIGINT)
        try:
            process.wait(0.5)
            return
        except subprocess.TimeoutExpired:
            continue


def interrupted_run(
    tmp_path: Path, url: str, form: str, kind: str, started: threading.Semaphore
) -> tuple[str, str, float]:
    """Run the script, Ctrl-C it once its commands all reached the double: its output,
    and the seconds from the (last) Ctrl-C to its end."""
    script = tmp_path / "pool_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, str(script), url, API_KEY, form, kind],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        for _ in range(COMMANDS):
            assert started.acquire(timeout=20), "the commands never all reached the double"
        process.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        if form == "with-block-twice":
            assert process.stdout is not None
            assert process.stdout.readline() == "interrupted\n"
            signalled = time.monotonic()
            press_again_until_it_ends(process)
        stdout, stderr = process.communicate(timeout=3 * PROMPT_EXIT)
        return stdout, stderr, time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("ctrl_c")
@pytest.mark.parametrize(
    "form",
    [
        "pool",
        "threads",
        "with-block",
        "with-block-once",
        "shutdown-in-finally",
        "with-exit",
        "with-block-twice",
    ],
)
def test_ctrl_c_ends_the_commands_running_on_worker_threads(
    tmp_path: Path, e2b_server: Callable[..., E2bServer], form: str
) -> None:
    started = threading.Semaphore(0)
    mock = e2b_server(command=holding(started), api_key=API_KEY)
    stdout, stderr, took = interrupted_run(tmp_path, mock.url, form, "e2b", started)
    assert "KeyboardInterrupt" in stderr, stderr[-2000:]
    assert "not reached" not in stdout
    assert took < PROMPT_EXIT, f"the process ran on for {took:.1f} s after Ctrl-C"
    kills = mock.find("POST", "/process.Process/SendSignal")
    assert [kill.json()["signal"] for kill in kills] == ["SIGNAL_SIGKILL"] * COMMANDS
    assert mock.count("DELETE", "/sandboxes/sbx1") == 1
    assert mock.live_sandboxes == []


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_inside_a_pool_block_deletes_the_kubernetes_claim_of_its_commands(
    tmp_path: Path,
) -> None:
    started = threading.Semaphore(0)
    with KubernetesServer(execute=holding(started)) as k8s:
        stdout, stderr, took = interrupted_run(tmp_path, k8s.url, "with-block-once", "k8s", started)
        assert "KeyboardInterrupt" in stderr, stderr[-2000:]
        assert "not reached" not in stdout
        assert took < PROMPT_EXIT, f"the process ran on for {took:.1f} s after Ctrl-C"
        assert k8s.count("DELETE") == 1
        assert k8s.live_claims == []
