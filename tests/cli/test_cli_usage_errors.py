"""A usage mistake is told at once, with its closest fix, under a one-line usage."""

from __future__ import annotations

import pytest

from piship_remote import cli


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == cli.EXIT_CONFIG
    return capsys.readouterr().err.splitlines()


def test_a_mistyped_option_says_did_you_mean_on_the_second_line(capsys) -> None:
    lines = usage_error(["map", "--szie", "4", "--", "echo {item}", "a"], capsys)
    assert lines[0] == "usage: piship-remote map [options] ..."
    assert lines[1] == (
        "piship-remote map: error: unrecognized arguments: --szie (did you mean --size?)"
    )
    assert lines[2] == "('piship-remote map --help' lists the options)"
    assert len(lines) == 3


def test_a_mistyped_command_says_did_you_mean_on_the_second_line(capsys) -> None:
    lines = usage_error(["swep"], capsys)
    assert "(did you mean sweep?)" in lines[1]
