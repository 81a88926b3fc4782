"""File metadata and entries on the local service, without a sandbox: which upload headers are
metadata, what envd refuses, and how a helper's output becomes entries with their metadata."""

from __future__ import annotations

import json

from piship_remote.local.sandbox.fs import ENTRY_FORMAT, parse_entries
from piship_remote.local.sandbox.metadata import from_headers, invalid, parse_found


def _record(kind: str, target: str, path: str, link: str = "") -> bytes:
    fields = [kind, target, "5", "644", "user", "user", "1700000000.5", link, path]
    assert ENTRY_FORMAT.count(r"\0") == len(fields)
    return b"".join(f.encode() + b"\0" for f in fields)


def test_only_x_metadata_headers_are_metadata_with_lowercased_keys() -> None:
    headers = {"x-metadata-Author": "mish", "content-type": "application/octet-stream"}
    assert from_headers(headers) == {"author": "mish"}


def test_printable_ascii_metadata_within_envds_bounds_is_accepted() -> None:
    assert invalid({"author": "mish", "purpose": "a b~c"}) is None


def test_a_control_character_in_a_value_is_refused() -> None:
    assert invalid({"good": "bad\nvalue"}) is not None


def test_a_key_longer_than_246_bytes_is_refused() -> None:
    assert invalid({"k" * 247: "v"}) is not None


def test_more_than_4096_bytes_of_metadata_is_refused() -> None:
    assert invalid({f"key{i}": "v" * 100 for i in range(41)}) is not None


def test_entries_carry_the_metadata_printed_after_them() -> None:
    found = json.dumps({"/home/user/a.txt": {"author": "mish"}}).encode()
    output = _record("f", "f", "/home/user/a.txt") + _record("d", "d", "/home/user/d") + found
    entries = parse_entries(output)
    assert [(e.path, e.metadata) for e in entries] == [
        ("/home/user/a.txt", {"author": "mish"}),
        ("/home/user/d", {}),
    ]


def test_entries_without_metadata_output_have_none() -> None:
    [entry] = parse_entries(_record("f", "f", "/tmp/x"))
    assert entry.metadata == {}


def test_unreadable_metadata_output_is_no_metadata() -> None:
    assert parse_found(b'{"/x": "not an object"}') == {}
    assert parse_found(b"not json") == {}


def test_a_symlink_is_its_targets_type_with_an_absolute_target() -> None:
    [entry] = parse_entries(_record("l", "f", "/home/user/dir/link", link="../t.txt"))
    assert (entry.type, entry.symlink_target) == ("FILE_TYPE_FILE", "/home/user/t.txt")
    assert not entry.is_symlink
