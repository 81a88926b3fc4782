"""A kubeconfig exec plugin that answers a client certificate (not a token): the plugin is
run again once the certificate is near its expirationTimestamp, and the next
connections present the new certificate — to the API and through the port-forward."""

from __future__ import annotations

import datetime
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")  # the test CA
pytest.importorskip("kubernetes.config")  # the kubernetes extra

from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import Cluster, KubernetesServer
from tests.support.k8s_tls import CLIENT_NAME, Pki
from tests.support.kubeconfig import exec_user, kubeconfig_backend, plugin_runs

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(30)

POLICY = {"required": True, "network": {"mode": "allow"}}
ROTATED = "piship-user-rotated"


def certificate_plugin(
    tmp_path: Path, pki: Pki, expires_in: datetime.timedelta
) -> tuple[dict[str, Any], Path]:
    """An ``exec`` user whose plugin answers the pair named in ``<tmp>/plugin-pair``
    (``<cert path>\\n<key path>``) as PEM data, and counts its runs in ``<tmp>/plugin-runs``."""
    script = tmp_path / "plugin.py"
    runs = tmp_path / "plugin-runs"
    pair = tmp_path / "plugin-pair"
    pair.write_text(f"{pki.client_cert}\n{pki.client_key}\n")
    script.write_text(
        textwrap.dedent(
            f"""
            import datetime, json, pathlib
            pathlib.Path({str(runs)!r}).open("a").write("ran\\n")
            cert, key = pathlib.Path({str(pair)!r}).read_text().split()
            expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
                seconds={expires_in.total_seconds()})
            print(json.dumps({{
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {{
                    "clientCertificateData": pathlib.Path(cert).read_text(),
                    "clientKeyData": pathlib.Path(key).read_text(),
                    "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }},
            }}))
            """
        )
    )
    return exec_user(script), runs


def rotate(tmp_path: Path, pki: Pki, cluster: Cluster) -> None:
    """The cluster now wants the rotated certificate; the plugin answers it."""
    switch_plugin_pair(tmp_path, *pki.another_client(ROTATED))
    cluster.client_subject = ROTATED


def switch_plugin_pair(tmp_path: Path, cert: Path, key: Path) -> None:
    """The plugin answers ``cert`` and ``key`` from its next run (the file is replaced whole,
    so a run meanwhile reads the old pair or the new one)."""
    (tmp_path / "plugin-pair.new").write_text(f"{cert}\n{key}\n")
    (tmp_path / "plugin-pair.new").replace(tmp_path / "plugin-pair")


def test_an_expiring_client_certificate_runs_the_plugin_again_and_is_used(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    pki = Pki.create(tmp_path)
    cluster = Cluster(client_subject=CLIENT_NAME)
    mock = kubernetes_server(cluster=cluster, tls=pki.server_context())
    user, runs = certificate_plugin(tmp_path, pki, datetime.timedelta(seconds=30))
    with kubeconfig_backend(mock.url, pki.ca, tmp_path, user) as backend:
        assert backend.available().available
        first = plugin_runs(runs)
        rotate(tmp_path, pki, cluster)
        assert backend.available().available
    assert plugin_runs(runs) > first
    subjects = [subject for path, subject in mock.client_subjects]
    assert subjects == [CLIENT_NAME, ROTATED]


def test_a_client_certificate_far_from_expiry_is_reused(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    pki = Pki.create(tmp_path)
    mock = kubernetes_server(cluster=Cluster(client_subject=CLIENT_NAME), tls=pki.server_context())
    user, runs = certificate_plugin(tmp_path, pki, datetime.timedelta(hours=1))
    with kubeconfig_backend(mock.url, pki.ca, tmp_path, user) as backend:
        first = plugin_runs(runs)
        assert backend.available().available
        assert backend.available().available
    assert plugin_runs(runs) == first


def test_a_rotated_client_certificate_opens_the_next_port_forward(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    pytest.importorskip("websocket")
    pki = Pki.create(tmp_path)
    mock = kubernetes_server(tls=pki.server_context())  # any certificate: none is refused
    user, _ = certificate_plugin(tmp_path, pki, datetime.timedelta(seconds=30))
    backend = kubeconfig_backend(mock.url, pki.ca, tmp_path, user, router="port-forward")
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.run("echo before").stdout == "before\n"
        switch_plugin_pair(tmp_path, *pki.another_client(ROTATED))
        assert sandbox.run("echo after").stdout == "after\n"
    forwards = [s for p, s in mock.client_subjects if p.endswith("/portforward")]
    assert forwards[0] == CLIENT_NAME and forwards[-1] == ROTATED, forwards
