"""Run inside the compiled sidecar image (as root) by `test_candidate_fence_e2e.py`.

`scenario.py fenced <targets json>`: the real `NetworkFence` (with an API-style root listener as
the sidecar's service port), the real inference gateway on loopback with one evaluation's token,
and the real `CandidateLauncher` starting one candidate host that runs
`agents/fence_candidate.py` (mounted at /opt/fence) over the host's wire protocol. First the same
probes are made as root (unfenced: the control that the targets are reachable at all); prints
`LISTENING` once the candidate holds its ports, then one JSON line with the control and the
candidate's report.

The launcher confines its hosts as the sidecar's does (`HostNamespaces`: the checkout kept, the
trusted paths hidden; `/workspace` and `/vero/context` are planted readable by anyone, as their
volumes come). The candidate host leaves a marker in every shared place it can write and holds it
while it probes and listens; meanwhile a second host (alive at the same time) and, after the
first has ended, a third look for it (`fence_candidate.py`'s `look:`); their views are in the
JSON line (`concurrent`, `later`), with the trusted side's own look at `/tmp`, `/var/tmp` and
`/dev/shm` while the first held its marker (`real`).

`scenario.py install`: only installs the fence and opens a confining launcher, and prints the
`FenceUnavailable` and `NamespacesUnavailable` messages (run without the compose file's
capabilities: the fail-closed case).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

from vero.harbor.boundary.fence import FenceUnavailable, NetworkFence, ServiceListener, endpoints_of
from vero.harbor.boundary.launcher import CandidateLauncher
from vero.harbor.boundary.namespaces import HIDDEN_FROM_HOSTS, HostNamespaces, NamespacesUnavailable
from vero.harbor.boundary.wire import FrameWriter, read_frame
from vero.inference.gateway import GatewayServer, InferenceGateway
from vero.spec.compiled import CONTAINER_PATHS
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


async def _run_candidate(pipe: socket.socket, stderr_path: Path, instruction: str, listening=None) -> None:
    """One host's run of `fence_candidate.py`; `listening` (awaited once) when it holds its ports."""
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
    await writer.send({"op": "run", "instruction": instruction, "environment": {}})
    while True:
        done = asyncio.ensure_future(read_frame(reader, 1 << 20))
        while not done.done():
            await asyncio.sleep(0.2)
            if listening is not None and b"FENCE-LISTENING" in stderr_path.read_bytes():
                await listening()
                listening = None
        header, _ = done.result()
        if header.get("op") in ("done", "error"):
            break
    await writer.send({"op": "exit"})


async def _look(launcher: CandidateLauncher, marker: str) -> dict:
    """A host that only looks for what the first one left (`look:<marker>`); its `NS-REPORT`."""
    host = await launcher.spawn()
    assert host.pipe is not None
    pipe, host.pipe = host.pipe, None
    await asyncio.wait_for(_run_candidate(pipe, host.stderr_path, f"look:{marker}"), timeout=120)
    tail = await host.finish(grace_sec=5)
    lines = [line for line in tail.splitlines() if line.startswith("NS-REPORT ")]
    return json.loads(lines[-1].removeprefix("NS-REPORT ")) if lines else {"stderr": tail[-2000:]}


def _plant_trusted() -> list[str]:
    """`/workspace` and `/vero/context` as their volumes come (readable by anyone), with a secret."""
    planted = []
    for path in (CONTAINER_PATHS.agent_repo, CONTAINER_PATHS.context):
        Path(path).mkdir(parents=True, exist_ok=True)
        Path(path).chmod(0o755)
        (Path(path) / "secret.txt").write_text("trusted")
        (Path(path) / "secret.txt").chmod(0o644)
        planted += [str(path), str(Path(path) / "secret.txt")]
    return planted


def _real_places(marker: str) -> dict:
    return {p: [n for n in os.listdir(p) if marker in n] for p in ("/tmp", "/var/tmp", "/dev/shm")}


def _kernel_state() -> dict:
    """Global counters hosts must not read, as root in the container reads them (the control)."""
    paths = (
        "/proc/sys/kernel/pty/nr",
        "/proc/sys/fs/aio-nr",
        "/sys/fs/cgroup/memory/memory.max_usage_in_bytes",
        "/sys/fs/cgroup/memory.peak",
    )
    return {path: Path(path).read_text().strip() if os.path.isfile(path) else None for path in paths}


async def fenced(targets: dict) -> dict:
    hidden = targets["hidden"] = _plant_trusted()
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

        namespaces = HostNamespaces.for_hosts(env, [CANDIDATE_DIR], HIDDEN_FROM_HOSTS)
        marker = f"vero-marker-{uuid.uuid4().hex[:8]}"
        seen: dict = {}
        async with (
            fence.admitting(endpoints_of(env)),
            CandidateLauncher(Path(sys.executable), env=env, on_host=on_host).confine(namespaces) as launcher,
        ):
            host = await launcher.spawn()
            assert host.pipe is not None
            pipe, host.pipe = host.pipe, None

            async def listening() -> None:
                print("LISTENING", flush=True)  # main probes the candidate's ports now
                # A host alive beside the first, which holds its markers until it ends.
                seen["concurrent"] = await _look(launcher, marker)
                seen["first_alive"] = host.process.returncode is None
                seen["real"] = _real_places(marker)
                seen["kernel"] = _kernel_state()

            await asyncio.wait_for(_run_candidate(pipe, host.stderr_path, f"leave:{marker}", listening), timeout=240)
            tail = await host.finish(grace_sec=5)
            seen["later"] = await _look(launcher, marker)
    for listener in listeners:
        listener.close()
    lines = [line for line in tail.splitlines() if line.startswith("FENCE-REPORT ")]
    report = json.loads(lines[-1].removeprefix("FENCE-REPORT ")) if lines else {"stderr": tail[-2000:]}
    return {"control": control, "candidate": report, "isolated": host.isolated, "hidden": hidden, **seen}


async def install_only() -> dict:
    """Without the compose file's capabilities: neither the fence nor the hosts' namespaces."""
    result: dict = {}
    try:
        await NetworkFence(service=[ServiceListener(API_PORT)]).install()
        result.update(installed=True)
    except FenceUnavailable as exc:
        result.update(installed=False, error=str(exc))
    try:
        async with CandidateLauncher(Path(sys.executable)).confine(HostNamespaces()):
            result.update(namespaces=True)
    except NamespacesUnavailable as exc:
        result.update(namespaces=False, namespaces_error=str(exc))
    return result


def main() -> None:
    if sys.argv[1] == "fenced":
        result = asyncio.run(fenced(json.loads(sys.argv[2])))
    else:
        result = asyncio.run(install_only())
    print(json.dumps(result), flush=True)
    time.sleep(0.1)


if __name__ == "__main__":
    main()
