"""Coverage-guided fuzzing of unpacking a sandbox's tar archive (raw bytes, or hostile
members built from them): ``python tests/fuzz/fuzz_archive.py -max_total_time=600``."""

from __future__ import annotations

from typing import TypeVar

import atheris

with atheris.instrument_imports(include=["piship_remote", "parsers"]):
    from parsers import check_unpack_tar

from atheris_input import run
from hostile_tar import COMPRESSIONS, FORMATS, LINKS, NAMES, SIZES, TYPES, Member, tar_bytes

T = TypeVar("T")


def _pick(fdp: atheris.FuzzedDataProvider, choices: tuple[T, ...]) -> T:
    return choices[fdp.ConsumeIntInRange(0, len(choices) - 1)]


def _member(fdp: atheris.FuzzedDataProvider) -> Member:
    name = _pick(fdp, NAMES) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(16)
    return Member(
        name=name,
        type=_pick(fdp, TYPES),
        data=fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 1100)),
        linkname=_pick(fdp, LINKS),
        mode=fdp.ConsumeIntInRange(0, 0o7777),
        size=_pick(fdp, SIZES) if fdp.ConsumeBool() else None,
        format=_pick(fdp, FORMATS),
    )


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        check_unpack_tar(fdp.ConsumeBytes(fdp.remaining_bytes()))
        return
    members = [_member(fdp) for _ in range(fdp.ConsumeIntInRange(0, 5))]
    cut = fdp.ConsumeIntInRange(0, 8192) if fdp.ConsumeBool() else None
    compression = _pick(fdp, COMPRESSIONS)
    check_unpack_tar(tar_bytes(members, end=fdp.ConsumeBool(), cut=cut, compression=compression))


if __name__ == "__main__":
    run(target)
