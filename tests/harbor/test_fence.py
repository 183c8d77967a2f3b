"""The candidate hosts' network fence: its rules, its bookkeeping, and failing closed.

The kernel side runs in `tests/e2e/test_candidate_fence_e2e.py` (in the compiled sidecar image).
Here `nft` is a recording stand-in: the real one would change this machine's own netfilter, which
other suites' candidate hosts (the same uid range) share. Only `nft --check`, which applies
nothing, sees the real tool, to show the generated ruleset is what nftables accepts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from harbor_cases import make_run

from vero.harbor import HarborBackend
from vero.harbor.boundary.fence import (
    FENCE_TABLE,
    Endpoint,
    FenceUnavailable,
    NetworkFence,
    ServiceListener,
    element_commands,
    endpoints_of,
    fence_ruleset,
)
from vero.harbor.boundary.launcher import CANDIDATE_UID_RANGE
from vero.harbor.case_route import CASE_ROUTE_VARIABLES
from vero.inference.gateway import gateway_environment
from vero.spec.models import CandidateRuntime

pytestmark = pytest.mark.timeout(60)


def _chain(ruleset: str, name: str) -> list[str]:
    lines = ruleset.splitlines()
    start = lines.index(f"\tchain {name} {{")
    end = lines.index("\t}", start)
    return [line.strip() for line in lines[start + 1 : end]]


def test_the_ruleset_lets_candidate_uids_out_only_to_the_gateways_and_nobody_in():
    ruleset = fence_ruleset(CANDIDATE_UID_RANGE, [ServiceListener(8000), ServiceListener(8001, "172.18.0.2")])
    lines = ruleset.splitlines()
    # Replaced whole and atomically: created (so the delete never fails), deleted, created again.
    table = f"table inet {FENCE_TABLE}"
    assert lines[:3] == [table, f"delete {table}", f"{table} {{"]
    assert _chain(ruleset, "output") == [
        "type filter hook output priority filter; policy accept;",
        "meta skuid 52000-59999 jump candidate",
    ]
    # The one accept: TCP, original direction, to a gateway endpoint; TCP refused, the rest dropped.
    assert _chain(ruleset, "candidate") == [
        "ct direction original meta l4proto tcp ip daddr . tcp dport @gateways accept",
        "meta l4proto tcp counter reject with tcp reset",
        "counter drop",
    ]
    inbound = _chain(ruleset, "input")
    assert inbound[0] == "type filter hook input priority filter; policy accept;"
    assert inbound[-1] == "counter drop"  # from other hosts, what is not admitted is dropped
    assert 'iif "lo" accept' in inbound and "ct state established,related accept" in inbound
    assert "\t\telements = { 8000 }" in lines and "\t\telements = { 172.18.0.2 . 8001 }" in lines
    # The gateways set starts empty: evaluations add their endpoints.
    gateways = lines[lines.index("\tset gateways {") : lines.index("\tset gateways {") + 3]
    assert gateways == ["\tset gateways {", "\t\ttype ipv4_addr . inet_service", "\t}"]


def test_a_ruleset_without_service_listeners_has_empty_sets():
    ruleset = fence_ruleset(range(60000, 60010))
    assert "meta skuid 60000-60009 jump candidate" in ruleset
    assert "elements" not in ruleset
    with pytest.raises(ValueError):
        fence_ruleset(range(0))
    with pytest.raises(ValueError):
        fence_ruleset(range(52000, 60000, 2))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None, reason="nft --check needs root and nftables")
def test_nftables_accepts_the_ruleset_and_the_element_commands():
    script = fence_ruleset(CANDIDATE_UID_RANGE, [ServiceListener(8000), ServiceListener(8001, "10.0.0.2")])
    script += element_commands("add", [Endpoint("127.0.0.1", 4000), Endpoint("10.0.0.2", 4001)])
    # --check validates the whole batch in the kernel and applies none of it.
    done = subprocess.run(["nft", "--check", "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_element_commands_add_and_delete_each_endpoint_once():
    endpoints = [Endpoint("127.0.0.1", 4000), Endpoint("10.0.0.2", 4001), Endpoint("127.0.0.1", 4000)]
    assert element_commands("add", endpoints) == (
        f"add element inet {FENCE_TABLE} gateways {{ 10.0.0.2 . 4001, 127.0.0.1 . 4000 }}\n"
    )
    assert element_commands("delete", endpoints[:1]).startswith(f"delete element inet {FENCE_TABLE} gateways")
    assert element_commands("add", []) == ""
    with pytest.raises(ValueError):
        element_commands("flush", endpoints)


def test_endpoints_come_from_the_gateway_and_case_route_urls_only():
    env = {
        **gateway_environment("http://127.0.0.1:4000", "tok"),
        CASE_ROUTE_VARIABLES[0]: "http://172.30.0.2:4100/openai/v1",
        CASE_ROUTE_VARIABLES[1]: "http://172.30.0.2:4100/anthropic",
        "VERO_FENCE_OTHER": "http://10.9.9.9:1",
    }
    assert endpoints_of(env) == {Endpoint("127.0.0.1", 4000), Endpoint("172.30.0.2", 4100)}
    assert endpoints_of({"PATH": "/usr/bin"}) == frozenset()
    with pytest.raises(FenceUnavailable, match="IPv4 gateway addresses only"):
        endpoints_of({"OPENAI_BASE_URL": "http://gateway.internal:4000/v1"})
    with pytest.raises(ValueError):
        Endpoint("::1", 4000)
    with pytest.raises(ValueError):
        ServiceListener(0)


def _fake_nft(tmp_path: Path, exit_code: int = 0, stderr: str = "") -> tuple[str, Path]:
    """An `nft` that appends each batch it is given to `batches/` and exits `exit_code`."""
    batches = tmp_path / "batches"
    batches.mkdir()
    script = tmp_path / "nft"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(ls "{batches}" | wc -l); cat > "{batches}/$n.nft"\n'
        + (f"echo '{stderr}' >&2\n" if stderr else "")
        + f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), batches


def _batches(batches: Path) -> list[str]:
    return [p.read_text() for p in sorted(batches.iterdir(), key=lambda p: int(p.stem))]


def test_the_fence_installs_once_and_counts_endpoints_shared_by_evaluations(tmp_path):
    nft, batches = _fake_nft(tmp_path)
    fence = NetworkFence(service=[ServiceListener(8000)], nft=nft)
    loopback, route_a, route_b = Endpoint("127.0.0.1", 4000), Endpoint("172.30.0.2", 4100), Endpoint("172.31.0.2", 4200)

    async def scenario() -> None:
        async with fence.admitting([loopback, route_a]):
            async with fence.admitting([loopback, route_b]):
                pass
            async with fence.admitting([loopback]):
                pass

    asyncio.run(scenario())
    applied = _batches(batches)
    assert applied[0] == fence_ruleset(CANDIDATE_UID_RANGE, [ServiceListener(8000)])
    assert applied[1:] == [
        element_commands("add", [loopback, route_a]),
        element_commands("add", [route_b]),  # the loopback gateway was admitted already
        element_commands("delete", [route_b]),  # ... and stays while the first evaluation runs
        element_commands("delete", [loopback, route_a]),
    ]
    assert fence.installed


def test_a_fence_that_cannot_be_installed_says_why(tmp_path):
    nft, _ = _fake_nft(tmp_path, exit_code=1, stderr="Error: Could not process rule: Operation not permitted")
    with pytest.raises(FenceUnavailable, match="CAP_NET_ADMIN") as raised:
        asyncio.run(NetworkFence(nft=nft).install())
    assert "do not run unconfined" in str(raised.value)
    with pytest.raises(FenceUnavailable, match="not installed"):
        asyncio.run(NetworkFence(nft=str(tmp_path / "no-such-nft")).install())


def test_an_agent_evaluation_behind_a_fence_that_cannot_be_installed_fails_closed(tmp_path):
    """The failure is an infrastructure one (the sidecar refunds it), raised before the launcher
    opens, so no host starts; a fence over hosts that would not be isolated fails the same way."""
    nft, batches = _fake_nft(tmp_path, exit_code=1, stderr="Operation not permitted")
    run = make_run(runtime=CandidateRuntime(kind="agent", agent_import_path="x:Y"), candidate_dir=tmp_path)
    fenced = HarborBackend(isolate_candidates=os.geteuid() == 0)
    fenced.confine_candidates(NetworkFence(nft=nft))
    if os.geteuid() == 0:
        with pytest.raises(FenceUnavailable, match="CAP_NET_ADMIN"):
            asyncio.run(fenced.evaluate(run))
        assert len(_batches(batches)) == 1  # the install was tried, nothing after it
    unisolated = HarborBackend(isolate_candidates=False)
    unisolated.confine_candidates(NetworkFence(nft=nft))
    with pytest.raises(FenceUnavailable, match="this process's user"):
        asyncio.run(unisolated.evaluate(run))


def test_the_sidecar_api_is_admitted_where_it_listens():
    """A wildcard bind admits the port on every address (no other socket can hold it then); bound
    addresses admit exactly those (a candidate could bind the same port on another address)."""
    import socket

    from vero.sidecar.app import service_listeners

    assert service_listeners("0.0.0.0", 8000, None) == [ServiceListener(8000)]
    assert service_listeners("10.1.2.3", 8000, None) == [ServiceListener(8000, "10.1.2.3")]
    assert service_listeners("eval-sidecar", 8000, None) == [ServiceListener(8000)]
    bound = []
    try:
        for address in ("127.0.0.1", "127.0.0.2"):
            sock = socket.socket()
            sock.bind((address, 0))
            bound.append(sock)
        assert service_listeners("0.0.0.0", 8000, bound) == []  # loopback is never filtered
    finally:
        for sock in bound:
            sock.close()
