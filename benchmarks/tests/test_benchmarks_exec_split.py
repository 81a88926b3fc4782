"""benchmarks/exec_split.py: every client gets a p50 row, and the renewal is put back."""

from __future__ import annotations

import pytest

from benchmarks.exec_split import main
from piship_remote.backends.e2b._lease import SandboxLease


@pytest.mark.timeout(120)
def test_every_client_is_measured_and_the_lease_is_left_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cover = SandboxLease.cover
    main(["--commands", "50"])
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if " p50 " in line]
    assert {"ours-sandbox", "ours-sandbox-no-renewal", "raw-renewal-and-start"} <= set(rows)
    assert SandboxLease.cover is cover
