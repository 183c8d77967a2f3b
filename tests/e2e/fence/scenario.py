"""Run inside the compiled sidecar image (as root) by `test_candidate_fence_e2e.py`.

`scenario.py fenced <targets json>`: the real `NetworkFence` (with an API-style root listener as
the sidecar's service port), the real inference gateway on loopback with one evaluation's token,
and the real `CandidateLauncher` starting one candidate host that runs
`agents/fence_candidate.py` (mounted at /opt/fence) over the host's wire protocol. First the same
probes are made as root (unfenced: the control that the targets are reachable at all); prints
`LISTENING` once the candidate holds its ports, then one JSON line with the control and the
candidate's report.

`scenario.py install`: only installs the fence and prints the `FenceUnavailable` message, if any
(run without CAP_NET_ADMIN: the fail-closed case).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path

from vero.harbor.boundary.fence import FenceUnavailable, NetworkFence, ServiceListener, endpoints_of
from vero.harbor.boundary.launcher import CandidateLauncher
from vero.harbor.boundary.wire import FrameWriter, read_frame
from vero.inference.gateway import GatewayServer, InferenceGateway
from vero.spec.models import InferenceSpec

API_PORT = 8000
CANDIDATE_DIR = Path("/opt/fence")


def _root_listener(address: str, port: int) -> socket.socket:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(16)

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
                connection.close()
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return listener


def _control(targets: dict) -> dict:
    """The probes the candidate makes, made by root (whom the fence does not confine)."""
    result = {}
    deadline = time.monotonic() + 60
    while True:  # `main`'s listener may still be starting
        try:
            socket.create_connection((targets["main"], targets["main_tcp"]), timeout=5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    for name, address in (
        ("main_tcp", (targets["main"], targets["main_tcp"])),
        ("loopback_tcp", ("127.0.0.1", targets["loopback"])),
    ):
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(b"CONTROL")
        sock.close()
        result[name] = "connected"
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.sendto(b"CONTROL", (targets["main"], targets["main_udp"]))
    result["main_udp"] = "sent"
    result["dns"] = socket.getaddrinfo(targets["main_name"], 80)[0][4][0]
    return result


async def _run_candidate(pipe: socket.socket, stderr_path: Path) -> None:
    reader, raw = await asyncio.open_connection(sock=pipe)
    writer = FrameWriter(raw)
    await writer.send(
        {
            "op": "init",
            "import_path": "fence_candidate:FenceCandidate",
            "candidate_dir": str(CANDIDATE_DIR),
            "limits": {},
            "probe_paths": [],
        }
    )
    for expected in ("hello", "ready"):
        header, _ = await read_frame(reader, 1 << 20)
        assert header.get("op") == expected, header
    await writer.send({"op": "run", "instruction": "leave", "environment": {}})
    announced = False
    while True:
        done = asyncio.ensure_future(read_frame(reader, 1 << 20))
        while not done.done():
            await asyncio.sleep(0.2)
            if not announced and b"FENCE-LISTENING" in stderr_path.read_bytes():
                print("LISTENING", flush=True)
                announced = True
        header, _ = done.result()
        if header.get("op") in ("done", "error"):
            break
    await writer.send({"op": "exit"})


async def fenced(targets: dict) -> dict:
    listeners = [_root_listener("127.0.0.1", targets["loopback"]), _root_listener("0.0.0.0", targets["api"])]
    control = _control(targets)
    spec = InferenceSpec.model_validate(
        {
            "providers": {"openai": {"api": "openai", "base_url": "http://127.0.0.1:9/v1"}},
            "models": {
                "gpt-4o-mini": {"provider": "openai", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
            },
        }
    )
    gateway = InferenceGateway(spec, {})
    fence = NetworkFence(service=[ServiceListener(targets["api"])])
    async with GatewayServer(gateway):
        token, _ = gateway.grant("fence-e2e", "train", limit_micro_usd=None)
        env = {**gateway.environment(token), "VERO_FENCE_TARGETS": json.dumps(targets)}

        def on_host(uid: int, alive: bool) -> None:
            (gateway.bind_host if alive else gateway.release_host)(token, uid)

        async with (
            fence.admitting(endpoints_of(env)),
            CandidateLauncher(Path(sys.executable), env=env, on_host=on_host) as launcher,
        ):
            host = await launcher.spawn()
            assert host.pipe is not None
            pipe, host.pipe = host.pipe, None
            await asyncio.wait_for(_run_candidate(pipe, host.stderr_path), timeout=180)
            tail = await host.finish(grace_sec=5)
    for listener in listeners:
        listener.close()
    lines = [line for line in tail.splitlines() if line.startswith("FENCE-REPORT ")]
    report = json.loads(lines[-1].removeprefix("FENCE-REPORT ")) if lines else {"stderr": tail[-2000:]}
    return {"control": control, "candidate": report, "isolated": host.isolated}


async def install_only() -> dict:
    try:
        await NetworkFence(service=[ServiceListener(API_PORT)]).install()
    except FenceUnavailable as exc:
        return {"installed": False, "error": str(exc)}
    return {"installed": True}


def main() -> None:
    if sys.argv[1] == "fenced":
        result = asyncio.run(fenced(json.loads(sys.argv[2])))
    else:
        result = asyncio.run(install_only())
    print(json.dumps(result), flush=True)
    time.sleep(0.1)


if __name__ == "__main__":
    main()
