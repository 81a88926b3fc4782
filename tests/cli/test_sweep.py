"""``piship-remote sweep``: it lists and deletes what this library created, and nothing else."""

from __future__ import annotations

import json

import pytest
import requests

from piship_remote.cli import main
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer

pytestmark = pytest.mark.timeout(30)
PISHIP = {"created-by": "piship"}


@pytest.fixture
def e2b_orphans(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("E2B_API_KEY", "e2b_test_key")
    with E2bServer() as server:
        server.plant("ours-old", metadata=PISHIP, age=7200)
        server.plant("ours-young", metadata=PISHIP, age=60)
        server.plant("theirs-old", metadata={"created-by": "someone-else"}, age=7200)
        server.plant("unmarked-old", age=7200)
        yield server


def e2b_sweep(server: E2bServer, *options: str) -> list[str]:
    return ["sweep", "--backend", "e2b", "--endpoint", server.url, *options]


def test_e2b_dry_run_lists_the_old_orphans_and_deletes_nothing(e2b_orphans, capsys) -> None:
    status = main(e2b_sweep(e2b_orphans, "--older-than", "1h", "--dry-run", "--json"))
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert out["dryRun"] is True
    assert [s["id"] for s in out["sandboxes"]] == ["ours-old"]
    assert len(e2b_orphans.live_sandboxes) == 4


def test_e2b_sweep_deletes_only_what_piship_created(e2b_orphans, capsys) -> None:
    assert main(e2b_sweep(e2b_orphans, "--older-than", "30m")) == 0
    assert "deleted ours-old" in capsys.readouterr().out
    assert sorted(e2b_orphans.live_sandboxes) == ["ours-young", "theirs-old", "unmarked-old"]
    assert main(e2b_sweep(e2b_orphans)) == 0
    assert sorted(e2b_orphans.live_sandboxes) == ["theirs-old", "unmarked-old"]
    listed = [r.path for r in e2b_orphans.requests if r.method == "GET"]
    assert all("metadata=created-by%3Dpiship" in path for path in listed)


def claim(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {"warmPoolRef": {"name": "python-pool"}},
    }


@pytest.fixture
def k8s_orphans():
    with KubernetesServer() as server:
        for name, labels in (
            ("piship-orphan", {"agents.x-k8s.io/created-by": "piship"}),
            ("someone-elses", {"agents.x-k8s.io/created-by": "someone"}),
            ("unlabelled", {}),
        ):
            answer = requests.post(server.url + CLAIMS, json=claim(name, labels), timeout=5)
            assert answer.status_code == 201, answer.text
        yield server


def k8s_sweep(server: KubernetesServer, *options: str) -> list[str]:
    url = server.url
    return [
        "sweep", "--backend", "kubernetes", "--api", url, "--router", url,
        "--pool", "python-pool", "--namespace", "agents", *options,
    ]  # fmt: skip


def test_kubernetes_dry_run_lists_only_labelled_claims(k8s_orphans, capsys) -> None:
    assert main(k8s_sweep(k8s_orphans, "--dry-run", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["id"] for s in out["sandboxes"]] == ["piship-orphan"]
    assert len(k8s_orphans.live_claims) == 3


def test_kubernetes_sweep_respects_older_than_and_deletes_only_labelled(
    k8s_orphans, capsys
) -> None:
    assert main(k8s_sweep(k8s_orphans, "--older-than", "1d")) == 0
    assert len(k8s_orphans.live_claims) == 3  # nothing that old
    assert main(k8s_sweep(k8s_orphans)) == 0
    assert "deleted piship-orphan" in capsys.readouterr().out
    assert sorted(k8s_orphans.live_claims) == ["someone-elses", "unlabelled"]


def test_a_bad_duration_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sweep", "--older-than", "soon"])
    assert exited.value.code == 2


def test_e2b_sweep_with_a_label_deletes_only_what_carries_it(e2b_orphans, capsys) -> None:
    e2b_orphans.plant("run-a", metadata={**PISHIP, "run": "a"}, age=10)
    e2b_orphans.plant("run-b", metadata={**PISHIP, "run": "b"}, age=10)
    assert main(e2b_sweep(e2b_orphans, "--label", "run=a")) == 0
    assert "deleted run-a" in capsys.readouterr().out
    assert "run-a" not in e2b_orphans.live_sandboxes
    assert {"run-b", "ours-old", "ours-young"} <= set(e2b_orphans.live_sandboxes)


def test_kubernetes_sweep_with_a_label_deletes_only_what_carries_it(k8s_orphans) -> None:
    ours = {"agents.x-k8s.io/created-by": "piship"}
    for name, run in (("piship-run-a", "a"), ("piship-run-b", "b")):
        body = claim(name, {**ours, "run": run})
        assert requests.post(k8s_orphans.url + CLAIMS, json=body, timeout=5).status_code == 201
    assert main(k8s_sweep(k8s_orphans, "--label", "run=a")) == 0
    assert sorted(k8s_orphans.live_claims) == [
        "piship-orphan", "piship-run-b", "someone-elses", "unlabelled",
    ]  # fmt: skip


def test_a_label_without_a_value_sign_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sweep", "--label", "run"])
    assert exited.value.code == 2
