"""The official E2B Python SDK's network options against the local service: egress rules
are enforced (even against the sandbox's root) or refused with a 400, never ignored;
internet is on when the create leaves it out; ``get_info`` echoes what was set and the
sandbox's own sizes; ``maskRequestHost`` and the ``Host`` a port request carries.

Every address tried from inside a sandbox is its gateway ``10.0.2.2``, the host's
loopback seen through slirp4netns, which the service keeps closed
(``--disable-host-loopback``): a connection there is refused by the stack
(``ENETUNREACH``) unless an egress rule refuses it first (``EHOSTUNREACH``: ICMP
"administratively prohibited").
"""

from __future__ import annotations

import errno
import http.client
import time
from collections.abc import Iterator

import pytest
from local_e2b import local_e2b_service

from tests.support.optional_peers import install_hint

pytest.importorskip("e2b", reason=install_hint("interop"))

from e2b import Sandbox, SandboxException, SandboxNetworkOpts
from sdk_target import Target

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation import egress
from piship_remote.local.isolation.network import egress_problem

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

needs_slirp = pytest.mark.skipif(egress_problem() is not None, reason=str(egress_problem()))
needs_rules = pytest.mark.skipif(
    egress.rules_problem() is not None or egress_problem() is not None,
    reason=str(egress.rules_problem() or egress_problem()),
)
GATEWAY = "10.0.2.2"
CONNECT = (
    'python3 -c "import socket; s = socket.socket(); s.settimeout(5)\n'
    "try:\n    s.connect(('{host}', {port})); print('connected')\n"
    'except OSError as e:\n    print(e.errno)"'
)
UNDO_AS_ROOT = (
    "nft flush ruleset; nft delete table inet piship_egress; ip route flush table main; true"
)
HEADERS_SERVER = (
    'python3 -c "import http.server\n'
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        open('/tmp/headers.txt', 'w').write(str(self.headers))\n"
    "        self.send_response(200); self.end_headers()\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', {port}), H).handle_request()\""
)


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with local_e2b_service() as running:
        yield running


@pytest.fixture
def target(service: LocalE2bService) -> Target:
    return Target(service.url, service.api_key)


@pytest.fixture
def sandboxes(target: Target) -> Iterator[list[Sandbox]]:
    made: list[Sandbox] = []
    yield made
    for sandbox in made:
        sandbox.kill()


def made(sandboxes: list[Sandbox], target: Target, **extra: object) -> Sandbox:
    sandbox = target.create(timeout=120, **extra)
    sandboxes.append(sandbox)
    return sandbox


def gateway_errno(sandbox: Sandbox, *, user: str = "user") -> int | None:
    """What connecting to the gateway gives inside the sandbox: an errno, or ``None``."""
    output = sandbox.commands.run(CONNECT.format(host=GATEWAY, port=9), user=user).stdout  # type: ignore[call-overload]
    answer = output.strip()
    return None if answer == "connected" else int(answer)


# -- refused, never ignored ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("network", "named"),
    [
        (SandboxNetworkOpts(allow_out=["example.com"], deny_out=["0.0.0.0/0"]), "example.com"),
        (SandboxNetworkOpts(deny_out=["*.example.com"]), "*.example.com"),
        ({"egress_proxy": {"address": "127.0.0.1:3128"}}, "egressProxy"),
    ],
)
def test_rules_the_service_cannot_enforce_are_refused_naming_them(
    target: Target, network: SandboxNetworkOpts, named: str
) -> None:
    with pytest.raises(SandboxException, match="400") as refused:
        target.create(network=network)
    assert named in str(refused.value)


def test_rules_are_refused_where_nft_is_missing(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress, "_nft", lambda: None)
    with pytest.raises(SandboxException, match="400") as refused:
        target.create(network=SandboxNetworkOpts(deny_out=["10.0.2.2"]))
    assert "cannot be enforced here" in str(refused.value)


# -- enforced -------------------------------------------------------------------------------


@needs_slirp
def test_without_rules_the_gateway_is_refused_by_the_network_stack(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target, allow_internet_access=True)
    assert gateway_errno(sandbox) == errno.ENETUNREACH


@needs_rules
def test_a_denied_address_is_refused_before_it_leaves_the_sandbox(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target, network=SandboxNetworkOpts(deny_out=[GATEWAY]))
    assert gateway_errno(sandbox) == errno.EHOSTUNREACH


@needs_rules
def test_the_sandbox_root_cannot_undo_the_rules(target: Target, sandboxes: list[Sandbox]) -> None:
    sandbox = made(sandboxes, target, network=SandboxNetworkOpts(deny_out=["0.0.0.0/0"]))
    sandbox.commands.run(UNDO_AS_ROOT, user="root")  # type: ignore[call-overload]
    assert gateway_errno(sandbox, user="root") == errno.EHOSTUNREACH


@needs_rules
def test_allow_out_wins_over_deny_all(target: Target, sandboxes: list[Sandbox]) -> None:
    network = SandboxNetworkOpts(allow_out=[GATEWAY], deny_out=["0.0.0.0/0"])
    sandbox = made(sandboxes, target, network=network)
    assert gateway_errno(sandbox) == errno.ENETUNREACH


@needs_rules
def test_allow_out_opens_an_address_of_a_sandbox_without_internet(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    network = SandboxNetworkOpts(allow_out=[GATEWAY])
    sandbox = made(sandboxes, target, allow_internet_access=False, network=network)
    assert gateway_errno(sandbox) == errno.ENETUNREACH


@needs_rules
def test_the_rules_hold_again_after_a_reboot(target: Target, sandboxes: list[Sandbox]) -> None:
    sandbox = made(sandboxes, target, network=SandboxNetworkOpts(deny_out=[GATEWAY]))
    assert sandbox.pause(keep_memory=False) is True
    resumed = target.connect(sandbox.sandbox_id)
    assert gateway_errno(resumed) == errno.EHOSTUNREACH


@needs_rules
def test_a_fork_holds_the_rules_of_its_source(target: Target, sandboxes: list[Sandbox]) -> None:
    sandbox = made(sandboxes, target, network=SandboxNetworkOpts(deny_out=[GATEWAY]))
    (fork,) = sandbox.fork()
    sandboxes.append(fork)
    assert gateway_errno(fork) == errno.EHOSTUNREACH


@needs_rules
def test_update_network_clears_the_rules_given_at_create(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target, network=SandboxNetworkOpts(deny_out=[GATEWAY]))
    sandbox.update_network({})
    assert gateway_errno(sandbox) == errno.ENETUNREACH
    assert (sandbox.get_info().network or {}).get("deny_out") is None


@needs_rules
def test_update_network_switches_internet_off(target: Target, sandboxes: list[Sandbox]) -> None:
    sandbox = made(sandboxes, target, allow_internet_access=True)
    sandbox.update_network({"allow_internet_access": False})
    assert gateway_errno(sandbox) == errno.EHOSTUNREACH
    assert sandbox.get_info().allow_internet_access is False


def test_update_network_with_address_rules_is_refused_naming_the_create_option(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target, allow_internet_access=False)
    with pytest.raises(SandboxException, match="allowOut/denyOut"):
        sandbox.update_network({"deny_out": [GATEWAY]})


# -- E2B's defaults, echoed ---------------------------------------------------------------


@needs_slirp
def test_internet_is_on_when_the_create_leaves_it_out(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target)
    assert sandbox.get_info().allow_internet_access is True
    assert "tap0" in sandbox.commands.run("cat /proc/net/route").stdout


def test_get_info_echoes_internet_access_as_set(target: Target, sandboxes: list[Sandbox]) -> None:
    sandbox = made(sandboxes, target, allow_internet_access=False)
    assert sandbox.get_info().allow_internet_access is False


@needs_rules
def test_get_info_echoes_the_network_rules(target: Target, sandboxes: list[Sandbox]) -> None:
    network = SandboxNetworkOpts(allow_out=[GATEWAY], deny_out=["0.0.0.0/0"])
    info = made(sandboxes, target, network=network).get_info()
    assert info.network is not None
    assert info.network.get("allow_out") == [GATEWAY]
    assert info.network.get("deny_out") == ["0.0.0.0/0"]


def test_get_info_sizes_are_the_sandbox_limits_get_metrics_reports(
    target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target, allow_internet_access=False)
    info = sandbox.get_info()
    sample = sandbox.get_metrics()[-1]
    assert (info.cpu_count, info.memory_mb * 1024 * 1024) == (sample.cpu_count, sample.mem_total)


# -- ports: the Host the sandbox's server sees ----------------------------------------------


def request_headers(service: LocalE2bService, sandbox: Sandbox, port: int, **sent: str) -> str:
    """The headers a server on ``port`` in the sandbox got for a request to ``get_host``."""
    sandbox.commands.run(HEADERS_SERVER.format(port=port), background=True)
    service_port = int(service.url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 15
    while True:
        connection = http.client.HTTPConnection("127.0.0.1", service_port, timeout=10)
        try:
            connection.putrequest("GET", "/", skip_host=True, skip_accept_encoding=True)
            connection.putheader("host", sandbox.get_host(port))
            for name, value in sent.items():
                connection.putheader(name, value)
            connection.endheaders()
            if connection.getresponse().status == 200:
                break
        finally:
            connection.close()
        assert time.monotonic() < deadline, "the server in the sandbox never answered"
        time.sleep(0.2)
    return sandbox.commands.run("cat /tmp/headers.txt").stdout


def test_mask_request_host_is_the_host_the_sandbox_server_sees(
    service: LocalE2bService, target: Target, sandboxes: list[Sandbox]
) -> None:
    network = SandboxNetworkOpts(mask_request_host="custom-host.example.com:${PORT}")
    sandbox = made(sandboxes, target, allow_internet_access=False, network=network)
    seen = request_headers(service, sandbox, 8080)
    assert seen.splitlines()[0] == "Host: custom-host.example.com:8080"


def test_a_port_request_carries_header_names_as_e2b_proxy_writes_them(
    service: LocalE2bService, target: Target, sandboxes: list[Sandbox]
) -> None:
    sandbox = made(sandboxes, target, allow_internet_access=False)
    seen = request_headers(service, sandbox, 8081, **{"x-trace-id": "7"})
    assert seen.splitlines()[:2] == [f"Host: {sandbox.get_host(8081)}", "X-Trace-Id: 7"]
