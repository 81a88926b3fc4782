"""What a push or pull says on stderr: one line with the files, the bytes and the paths left
out counted by reason (``run --sync`` once listed ~600 ``.pyc: ignored`` lines); ``-v``
lists each path."""

from __future__ import annotations

from piship_remote.cli._files import describe_transfer
from piship_remote.model.transfer import SkippedPath, TransferSummary

PUSHED = TransferSummary(
    3,
    2048,
    [SkippedPath(f"pkg/m{n}.pyc", "ignored") for n in range(600)]
    + [SkippedPath(".env", "secret file"), SkippedPath("link", "symlink leaves the workspace")],
)


def test_one_line_counts_what_was_left_out_by_reason() -> None:
    assert describe_transfer("pushed", PUSHED) == [
        "pushed 3 file(s), 2.0 KiB; skipped 602: 600 ignored, 1 secret file,"
        " 1 symlink leaves the workspace (-v lists them)"
    ]


def test_verbose_lists_every_path_left_out() -> None:
    lines = describe_transfer("pushed", PUSHED, verbose=True)
    assert len(lines) == 1 + 602
    assert lines[1] == "  skipped pkg/m0.pyc: ignored"
    assert "(-v lists them)" not in lines[0]


def test_nothing_left_out_says_only_what_moved() -> None:
    assert describe_transfer("pulled", TransferSummary(1, 10)) == ["pulled 1 file(s), 10 B"]
