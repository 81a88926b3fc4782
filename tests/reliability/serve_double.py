"""Run one test double in its own process (for the soak: the library's process then holds
only the library, so its threads, descriptors and memory can be measured alone).

    python serve_double.py e2b|k8s <credential>

Prints the double's URL on the first line, serves until stdin closes, then prints one
JSON line summarising what it saw and exits::

    {"live": [...], "counts": {"start": 5001, ...}, "leaks": [...], "errors": 0}

``leaks`` lists every place the credential appeared outside its own header, or a
host secret (given as further arguments) appeared at all.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from piship_remote.testing import CLAIMS, Cluster, E2bServer, KubernetesServer, leaks


def _e2b_answer(start: dict[str, Any]) -> dict[str, Any]:
    return {"stdout": f"{start['process']['args'][2]}\n"}


def _k8s_answer(command: str) -> dict[str, Any]:
    return {"stdout": f"{command}\n", "exit_code": 0}


def main(kind: str, credential: str, *host_secrets: str) -> None:
    server: E2bServer | KubernetesServer
    if kind == "e2b":
        server, header = E2bServer(command=_e2b_answer, api_key=credential), "x-api-key"
    else:
        server, header = KubernetesServer(_k8s_answer, Cluster(token=credential)), "authorization"
    with server:
        print(server.url, flush=True)
        sys.stdin.read()
        requests = server.requests
        counts = Counter(_kind(r.method, r.path) for r in requests)
        found = leaks(requests, credential, [header])
        for secret in host_secrets:
            found += leaks(requests, secret)
        live = server.live_sandboxes if isinstance(server, E2bServer) else server.live_claims
        summary = {"live": live, "counts": counts, "leaks": found, "errors": len(server.errors)}
    print(json.dumps(summary), flush=True)


def _kind(method: str, path: str) -> str:
    if path == "/process.Process/Start" or path == "/execute":
        return "command"
    if (path == CLAIMS and method == "POST") or (path == "/sandboxes" and method == "POST"):
        return "create"
    if method == "DELETE":
        return "delete"
    return f"{method} {path.split('?')[0]}"


if __name__ == "__main__":
    main(*sys.argv[1:])
