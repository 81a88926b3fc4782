"""``sweep`` on every backend with only what listing needs, each line showing the labels."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests

from piship_remote.cli import main
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer

pytestmark = pytest.mark.timeout(30)
OURS = {"agents.x-k8s.io/created-by": "piship"}


def claim(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {"warmPoolRef": {"name": "python-pool"}},
    }


def test_kubernetes_sweep_needs_no_router_or_pool(capsys) -> None:
    with KubernetesServer() as server:
        body = claim("piship-left", {**OURS, "run": "nightly"})
        assert requests.post(server.url + CLAIMS, json=body, timeout=5).status_code == 201
        args = ["sweep", "--backend", "kubernetes", "--api", server.url, "--namespace", "agents"]
        assert main(args) == 0
        assert server.live_claims == []
    assert "deleted piship-left (kubernetes" in capsys.readouterr().out


def test_each_line_shows_the_labels_without_the_librarys_marks(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_test_key")
    with E2bServer() as server:
        server.plant("run-a", metadata={"created-by": "piship", "run": "a"}, age=10)
        sweep = ["sweep", "--backend", "e2b", "--endpoint", server.url, "--dry-run"]
        assert main(sweep) == 0
        line = capsys.readouterr().out.strip()
        assert main([*sweep, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)["sandboxes"]
    assert line.startswith("would delete run-a (") and line.endswith(", run=a)")
    assert "created-by" not in line
    assert listed[0]["labels"] == {"run": "a"}


@pytest.fixture
def temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temporary folder, here: where local services make their directories."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def test_local_sweep_lists_and_removes_what_a_killed_process_left(temporary: Path, capsys) -> None:
    left = temporary / f"piship-local-{dead_pid()}-abc123"
    (left / "0123456789abcdef" / "home").mkdir(parents=True)
    alive = temporary / f"piship-local-{os.getpid()}-def456"
    (alive / "fedcba9876543210").mkdir(parents=True)
    assert main(["sweep", "--backend", "local", "--dry-run"]) == 0
    assert f"would delete {left.name} (local, " in capsys.readouterr().out
    assert left.exists()
    assert main(["sweep", "--backend", "local"]) == 0
    assert f"deleted {left.name} (local, " in capsys.readouterr().out
    assert not left.exists() and alive.exists()  # a running service's are not touched
