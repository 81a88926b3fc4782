"""Coverage-guided fuzzing of the sandbox router's answers and error bodies:
``python tests/fuzz/fuzz_router_answer.py -max_total_time=600``."""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["piship_remote", "parsers"]):
    from parsers import check_router_answer, check_status_body

from atheris_input import json_object, run


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        check_status_body(fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes()))
    else:
        check_router_answer(json_object(fdp))


if __name__ == "__main__":
    run(target)
