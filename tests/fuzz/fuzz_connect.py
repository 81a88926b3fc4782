"""Coverage-guided fuzzing of Connect envelope reading: ``python tests/fuzz/fuzz_connect.py
-max_total_time=600``."""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["piship_remote", "parsers"]):
    from parsers import check_envelopes

from atheris_input import run


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    cuts = [fdp.ConsumeIntInRange(0, 256) for _ in range(fdp.ConsumeIntInRange(0, 6))]
    limit = (0, 4, 64, 1 << 20)[fdp.ConsumeIntInRange(0, 3)]
    check_envelopes(fdp.ConsumeBytes(fdp.remaining_bytes()), cuts, limit)


if __name__ == "__main__":
    run(target)
