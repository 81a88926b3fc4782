"""Coverage-guided fuzzing of the E2B create answer: ``python tests/fuzz/fuzz_create_answer.py
-max_total_time=600``."""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["piship_remote", "parsers"]):
    from parsers import as_object, check_create_answer

from atheris_input import json_object, run


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    answer = as_object(fdp.ConsumeBytes(fdp.remaining_bytes())) if fdp.ConsumeBool() else None
    check_create_answer(answer if answer is not None else json_object(fdp))


if __name__ == "__main__":
    run(target)
