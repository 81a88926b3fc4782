"""Coverage-guided fuzzing of Kubernetes SandboxClaim objects (ready, expired, names, pod IPs):
``python tests/fuzz/fuzz_claim.py -max_total_time=600``."""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["piship_remote", "parsers"]):
    from parsers import as_object, check_claim

from atheris_input import json_object, run


def target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    claim = as_object(fdp.ConsumeBytes(fdp.remaining_bytes())) if fdp.ConsumeBool() else None
    check_claim(claim if claim is not None else json_object(fdp))


if __name__ == "__main__":
    run(target)
