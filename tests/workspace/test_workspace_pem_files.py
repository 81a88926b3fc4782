"""A ``.pem`` is kept home only when it may hold a key: a CA bundle (certificates only, as
certifi's ``cacert.pem``) is sent like any file."""

from __future__ import annotations

from pathlib import Path

import pytest

from piship_remote.model.transfer import SkippedPath
from piship_remote.workspace._tree import select_tree

CERTIFICATE = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def pushed(root: Path) -> tuple[list[str], list[SkippedPath]]:
    walked = select_tree(str(root), skip_secrets=True)
    return [entry.relative for entry in walked.entries], list(walked.skipped)


def test_a_ca_bundle_is_sent(tmp_path: Path) -> None:
    (tmp_path / "certifi").mkdir()
    (tmp_path / "certifi" / "cacert.pem").write_text(CERTIFICATE * 3)
    entries, skipped = pushed(tmp_path)
    assert "certifi/cacert.pem" in entries and skipped == []


@pytest.mark.parametrize(
    "content",
    [
        CERTIFICATE + "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----\n",
        "not a certificate at all",
    ],
)
def test_a_pem_that_may_hold_a_key_stays_home(tmp_path: Path, content: str) -> None:
    (tmp_path / "server.pem").write_text(content)
    assert pushed(tmp_path)[1] == [SkippedPath("server.pem", "secret file")]
