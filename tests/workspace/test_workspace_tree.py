"""What a push sends: denied, ignored and escaping paths stay on the host, each listed."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from piship_remote.model.transfer import SkippedPath, TransferSummary
from piship_remote.workspace._tree import IgnoreRules, TreeWalk, select_tree


def sent(root: Path, **options: object) -> list[str]:
    return [entry.relative for entry in select_tree(str(root), **options).entries]  # type: ignore[arg-type]


def skipped(root: Path, **options: object) -> list[SkippedPath]:
    return list(select_tree(str(root), **options).skipped)  # type: ignore[arg-type]


def test_sends_files_and_directories_in_order(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.c").write_text("int main;")
    (tmp_path / "Makefile").write_text("all:")
    assert sent(tmp_path) == ["Makefile", "src", "src/main.c"]


def test_counts_files_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "b").write_bytes(b"678")
    selection = select_tree(str(tmp_path))
    assert (selection.files, selection.bytes) == (2, 8)


def test_a_read_denied_path_never_leaves_the_host(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("k")
    (tmp_path / "ok").write_text("o")
    assert sent(tmp_path, read_deny=[str(tmp_path / "secrets")]) == ["ok"]
    assert skipped(tmp_path, read_deny=[str(tmp_path / "secrets")]) == [
        SkippedPath("secrets", "read-deny")
    ]


def test_gitignored_paths_are_skipped(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.o\nbuild/\n")
    (tmp_path / "a.o").write_text("")
    (tmp_path / "a.c").write_text("")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out").write_text("")
    assert sent(tmp_path) == [".gitignore", "a.c"]
    assert {s.path for s in skipped(tmp_path)} == {"a.o", "build"}


def test_a_nested_gitignore_applies_below_its_directory_and_wins(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / ".gitignore").write_text("!keep.log\n")
    (tmp_path / "logs" / "keep.log").write_text("")
    (tmp_path / "logs" / "drop.log").write_text("")
    (tmp_path / "top.log").write_text("")
    assert sent(tmp_path) == [".gitignore", "logs", "logs/.gitignore", "logs/keep.log"]


def test_gitignore_can_be_switched_off(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.o\n")
    (tmp_path / "a.o").write_text("")
    assert sent(tmp_path, use_gitignore=False) == [".gitignore", "a.o"]


def test_the_git_directory_is_not_sent(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("")
    assert sent(tmp_path) == []
    assert skipped(tmp_path) == [SkippedPath(".git", "ignored")]


def test_a_symlink_out_of_the_workspace_is_skipped(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(outside / "secret")
    (root / "relative-escape").symlink_to("../outside/secret")
    assert sent(root) == []
    assert {s.reason for s in skipped(root)} == {"symlink leaves the workspace"}


def test_a_symlink_inside_the_workspace_is_sent_as_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("r")
    (tmp_path / "alias").symlink_to("real")
    entries = select_tree(str(tmp_path)).entries
    assert [(e.relative, e.kind, e.link_target) for e in entries] == [
        ("alias", "symlink", "real"),
        ("real", "file", None),
    ]


def test_a_socket_is_not_a_regular_file(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        assert skipped(tmp_path) == [SkippedPath("sock", "not a regular file")]


def test_only_the_given_paths_are_sent_with_their_parents(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c").write_text("")
    (tmp_path / "other").write_text("")
    assert sent(tmp_path, paths=[str(tmp_path / "a" / "b" / "c")]) == ["a", "a/b", "a/b/c"]


def test_a_given_path_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    assert skipped(root, paths=[os.fspath(tmp_path)]) == [
        SkippedPath(os.fspath(tmp_path), "outside the workspace")
    ]


# -- the walk, one entry at a time --------------------------------------------------


def test_a_walk_yields_what_select_tree_sends_and_counts_it(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.c").write_bytes(b"int main;")
    (tmp_path / ".gitignore").write_text("*.o\n")
    (tmp_path / "main.o").write_bytes(b"obj")
    walk = TreeWalk(str(tmp_path))
    assert list(walk) == list(select_tree(str(tmp_path)).entries)
    assert walk.summary() == TransferSummary(2, 13, (SkippedPath("main.o", "ignored"),))


def test_a_walk_yields_an_entry_before_it_reads_further_directories(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("first")
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / ".gitignore").write_text("!\n")  # not a valid pattern: raises when read
    walk = iter(TreeWalk(str(tmp_path)))
    assert [next(walk).relative, next(walk).relative] == ["a", "z"]
    with pytest.raises(ValueError, match="Invalid git pattern"):
        list(walk)


# -- well-known secrets ---------------------------------------------------------------


def _secrets_tree(root: Path) -> None:
    for name in (".env", ".env.local", "id_rsa", "server.pem", "tls.key", "main.py"):
        (root / name).write_text("x")
    (root / ".env.example").write_text("TOKEN=")
    (root / ".npmrc").write_text("//registry.npmjs.org/:_authToken=npm_abc\n")
    (root / ".pypirc").write_text("[pypi]\nusername = me\n")  # no password: not a secret
    for folder in (".aws", ".azure", ".config/gcloud"):
        (root / folder).mkdir(parents=True)
        (root / folder / "credentials").write_text("x")


def test_a_push_leaves_well_known_secrets_at_home_each_with_its_reason(tmp_path: Path) -> None:
    _secrets_tree(tmp_path)
    walked = select_tree(str(tmp_path), skip_secrets=True)
    assert [entry.relative for entry in walked.entries] == [
        ".config",
        ".env.example",
        ".pypirc",
        "main.py",
    ]
    assert sorted(walked.skipped, key=lambda s: s.path) == [
        SkippedPath(".aws", "secret folder"),
        SkippedPath(".azure", "secret folder"),
        SkippedPath(".config/gcloud", "secret folder"),
        SkippedPath(".env", "secret file"),
        SkippedPath(".env.local", "secret file"),
        SkippedPath(".npmrc", "secret file"),
        SkippedPath("id_rsa", "secret file"),
        SkippedPath("server.pem", "secret file"),
        SkippedPath("tls.key", "secret file"),
    ]


def test_secrets_the_caller_names_are_sent(tmp_path: Path) -> None:
    _secrets_tree(tmp_path)
    named = [str(tmp_path / ".env"), str(tmp_path / ".aws")]
    walked = select_tree(str(tmp_path), skip_secrets=True, send_secrets=named)
    names = [entry.relative for entry in walked.entries]
    assert ".env" in names and ".aws/credentials" in names
    assert ".env.local" not in names


def test_without_skip_secrets_everything_readable_is_sent(tmp_path: Path) -> None:
    _secrets_tree(tmp_path)
    assert ".env" in sent(tmp_path)


# -- the ignore rules, for what comes back ----------------------------------------------


def test_ignore_rules_exclude_what_is_below_an_ignored_directory(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("build/\n*.pyc\n!keep.pyc\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / ".gitignore").write_text("local.txt\n")
    rules = IgnoreRules(str(tmp_path))
    assert rules.excludes("build/deep/out.o", is_dir=False)
    assert rules.excludes("pkg/__pycache__/m.pyc", is_dir=False)
    assert rules.excludes("pkg/local.txt", is_dir=False)
    assert rules.excludes(".git/config", is_dir=False)
    assert not rules.excludes("keep.pyc", is_dir=False)
    assert not rules.excludes("src/build.py", is_dir=False)
    assert not rules.excludes("local.txt", is_dir=False)
