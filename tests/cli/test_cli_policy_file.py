"""A ``--policy`` file that cannot be read is ``CONFIG_UNAVAILABLE``, as the README's table
says (a file that reads but is wrong stays ``CONFIG_INVALID``); both exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from piship_remote import cli


def test_a_missing_policy_file_is_config_unavailable(
    tmp_path: Path, cli_environ: pytest.MonkeyPatch, capsys
) -> None:
    missing = tmp_path / "nowhere.json"
    status = cli.main(["run", "--policy", str(missing), "--workspace", str(tmp_path), "--", "true"])
    assert status == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith(f"CONFIG_UNAVAILABLE: cannot read the policy file {missing}")


def test_the_readme_table_names_that_code_for_an_unreadable_file() -> None:
    readme = (Path(__file__).parents[2] / "README.rst").read_text(encoding="utf-8")
    row = readme[readme.index("   * - ``CONFIG_UNAVAILABLE``") :].splitlines()[1]
    assert "cannot be read" in row and "--policy" in row
