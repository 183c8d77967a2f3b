"""What an in-process ASGI client saves the sidecar tests against a real uvicorn server.

    python benchmarks/in_process_app.py [--rounds 15]

Both ways serve the same app (`tests/sidecar/_server.py`'s harness: a real state dir, agent repo
and the stub backend, as `tests/sidecar/test_app.py` uses it) and make the same calls: start the
app (its lifespan: the state store, the baseline import), `GET /health`, `GET /status`, one
`POST /evaluations` followed until the job is complete, stop. One way runs it under uvicorn on a
loopback port (`ServerThread`, an `httpx.Client` over TCP: what the tests do); the other through
Starlette's `TestClient` (the app called in-process, lifespan included, no socket). The rounds
alternate in one process, so both see the same load; CPU seconds (this process's user+sys, all
threads) are the figure to compare on a shared machine, wall seconds are printed beside them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `tests.sidecar._server`


def _calls(client, wait_for_state) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/status").status_code == 200
    job = client.post("/evaluations", json={"partition": "train"}).json()
    assert wait_for_state(client, job["id"], {"complete"})["state"] == "complete"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from tests.sidecar._server import make_harness, wait_for_state

    def real(harness) -> None:
        with harness.serve() as (_, client):
            _calls(client, wait_for_state)

    def in_process(harness) -> None:
        with TestClient(harness.create_app()) as client:
            _calls(client, wait_for_state)

    ways: dict[str, Callable] = {"uvicorn + httpx over TCP": real, "TestClient in-process": in_process}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    wall: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="vero-bench-asgi-") as scratch:
        for round_ in range(args.rounds + 1):
            for name, way in ways.items():
                harness = make_harness(Path(scratch) / f"{round_}-{len(cpu[name])}-{name[:4]}")
                c0, w0 = time.process_time(), time.perf_counter()
                way(harness)
                if round_:  # the first round warms imports and caches for both
                    cpu[name].append(time.process_time() - c0)
                    wall[name].append(time.perf_counter() - w0)
    for name in ways:
        print(
            f"{name:26s} median CPU {statistics.median(cpu[name]) * 1000:7.1f} ms"
            f"  wall {statistics.median(wall[name]) * 1000:7.1f} ms  ({args.rounds} rounds)"
        )
    names = list(ways)
    ratio = statistics.median(cpu[names[0]]) / statistics.median(cpu[names[1]])
    saved = statistics.median(cpu[names[0]]) - statistics.median(cpu[names[1]])
    print(f"in-process saves {saved * 1000:.1f} ms CPU per served app ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
