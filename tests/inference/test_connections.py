"""Caps on the connections candidates hold open to the gateway (`vero.inference.connections`), with
real sockets against a real `GatewayServer`: past its cap a caller's connections are closed as they
are accepted (the process's descriptors stay bounded), refusals are counted on its evaluation, its
admitted connections keep working, and another server on the same event loop keeps answering."""

from __future__ import annotations

import asyncio
import contextlib
import os

import httpx
import pytest

from vero.inference.connections import ConnectionCaps
from vero.inference.gateway import GatewayServer, InferenceGateway
from vero.spec.models import InferenceSpec

pytestmark = pytest.mark.timeout(120)

CAP = 8
FLOOD = 40


def _spec() -> InferenceSpec:
    return InferenceSpec.model_validate(
        {
            "providers": {"oai": {"api": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key_secret": "K"}},
            "models": {"m": {"provider": "oai", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}},
        }
    )


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _held_open(host: str, port: int) -> bool:
    """Whether a new connection stays open (False: the server closed or reset it unasked)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        data = await asyncio.wait_for(reader.read(1), timeout=0.5)
        return data != b""  # b"": closed by the server
    except TimeoutError:
        return True  # nothing sent, nothing closed: admitted
    except ConnectionError:
        return False
    finally:
        writer.close()


async def _flood() -> None:
    gateway = InferenceGateway(_spec(), {"K": "sk-x"}, connection_caps=ConnectionCaps(per_caller=CAP, total=CAP * 4))
    token, _ = gateway.grant("ev-1", "train", limit_micro_usd=None)
    gateway.bind_host(token, os.getuid())  # the caller is this test's process
    other = InferenceGateway(_spec(), {"K": "sk-x"})  # stands for the sidecar's API on the same loop
    async with GatewayServer(gateway) as server, GatewayServer(other) as bystander:
        host, port = server.url.removeprefix("http://").split(":")
        before = _open_fds()
        held = [await asyncio.open_connection(host, int(port)) for _ in range(CAP)]
        await asyncio.sleep(0.2)  # accepted by the server
        flooded = [await _held_open(host, int(port)) for _ in range(FLOOD)]
        # Our CAP held ones count 2 fds (our end, the server's); the refused ones were closed.
        assert _open_fds() - before <= 2 * CAP + 4
        assert flooded == [False] * FLOOD
        assert gateway.connections.open == CAP and gateway.connections.refusals == FLOOD
        # Another server of the process answers all along.
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{bystander.url}/openai/v1/models")).status_code == 401
        # An admitted connection still works (its caller check passes), and once one closes a
        # new connection is admitted again.
        reader, writer = held[0]
        writer.write(f"GET /openai/v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\r\n".encode())
        await writer.drain()
        assert (await asyncio.wait_for(reader.readline(), timeout=10)).startswith(b"HTTP/1.1 200")
        for _, w in held:
            w.close()
        await asyncio.sleep(0.2)
        assert gateway.connections.open == 0
        assert await _held_open(host, int(port))
        usage = await gateway.revoke(token)
    assert usage.refused_calls == {"too_many_connections": FLOOD}


def test_a_caller_past_its_cap_is_refused_as_accepted_and_the_rest_keeps_answering():
    asyncio.run(_flood())


def test_the_total_cap_is_a_share_of_the_descriptor_limit():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert ConnectionCaps().total_cap() == max(64, soft // 4)
    assert ConnectionCaps(total=10).total_cap() == 10


def test_the_netlink_check_gives_no_verdict_while_descriptors_are_out():
    """A process out of descriptors (a candidate may hold them) cannot run the one-time check that
    netlink answers here; that must not be taken as "netlink refused", which would send every later
    caller lookup to the tables (a scan needing a descriptor each) for good."""
    import resource

    from vero.inference.callers import _SockDiag

    diag = _SockDiag()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1, hard))
        with contextlib.suppress(OSError):
            while True:  # fill the holes below the limit: the next socket has no number left
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        assert diag.works() is False and diag.checked is None
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert diag.works() is True and diag.checked is True
