"""Coverage-guided fuzzing of the E2B Start stream (data, end and end-of-stream events):
``python tests/fuzz/fuzz_envd_stream.py -max_total_time=600``."""

from __future__ import annotations

import json

import atheris

with atheris.instrument_imports(include=["piship_remote", "parsers"]):
    from parsers import check_end_event, check_stream_payloads

from atheris_input import json_object, json_value, run


def _payload(fdp: atheris.FuzzedDataProvider) -> tuple[int, bytes]:
    flags = (0, 0, 0, 2)[fdp.ConsumeIntInRange(0, 3)]
    shape = fdp.ConsumeIntInRange(0, 2)
    if shape == 0:
        stream = ("stdout", "stderr")[fdp.ConsumeIntInRange(0, 1)]
        text = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 24))
        spaced = (", ", ": ") if fdp.ConsumeBool() else (",", ":")
        return flags, json.dumps({"event": {"data": {stream: text}}}, separators=spaced).encode()
    if shape == 1:
        return flags, json.dumps(json_object(fdp)).encode()
    return flags, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 32))


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        check_end_event(json_value(fdp))
    else:
        check_stream_payloads([_payload(fdp) for _ in range(fdp.ConsumeIntInRange(0, 5))])


if __name__ == "__main__":
    run(target)
