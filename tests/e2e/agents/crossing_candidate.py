"""A `kind: agent` candidate that tries to carry what it saw across evaluations, tiers and tokens.

Committed by `test_candidate_boundary_e2e.py` with `MODE` (and `PUBLIC`, `SLEEP_SEC`) filled in:

- `leak` (evaluated on a `none` partition): copies its case's instruction and data to every place
  a later candidate host could read: `/tmp`, `/var/tmp`, `/dev/shm`, a world-writable dir of the
  machine (`PUBLIC`), a world-writable tree it hands over, and a SysV shared memory segment with a
  fixed key;
- `read` (evaluated afterwards on a `full` partition): looks in all those places and puts what it
  found in its logs, which the harness copies into the trial's artifacts, i.e. to the agent;
- `steal` (two evaluations at once): publishes its gateway token in `PUBLIC`, waits for another
  evaluation's, and calls the gateway with it (and with its own, as a control);
- `sleep`: sleeps `SLEEP_SEC` seconds, as a candidate that times what it read would.

Each writes `report.json` in its logs dir (`<trial>/agent/candidate/` on the harness's side).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from pathlib import Path

from harbor.agents.base import BaseAgent

MODE = "{mode}"
PUBLIC = "{public}"
SLEEP_SEC = float("{sleep_sec}")
SHM_KEY = 0x7E4E0001
SHM_BYTES = 65536
PLACES = ("/tmp", "/var/tmp", "/dev/shm", PUBLIC)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _leak(text: str) -> dict:
    left = {}
    for place in PLACES:
        try:
            Path(place, "vero-leak.txt").write_text(text)
            os.chmod(Path(place, "vero-leak.txt"), 0o666)
            left[place] = "written"
        except OSError as exc:
            left[place] = type(exc).__name__
    tree = Path("/tmp/vero-leak-dir/inner")
    tree.mkdir(parents=True, exist_ok=True)
    for path in (tree, tree.parent):
        path.chmod(0o777)
    (tree / "answer.txt").write_text(text)
    libc = _libc()
    segment = libc.shmget(SHM_KEY, SHM_BYTES, 0o1000 | 0o666)  # IPC_CREAT
    left["shm"] = str(segment)
    if segment >= 0:
        libc.shmat.restype = ctypes.c_void_p
        address = libc.shmat(segment, None, 0)
        data = text.encode()[: SHM_BYTES - 1]
        ctypes.memmove(address, data, len(data))
    return left


def _read() -> dict:
    found = {}
    for place in (*PLACES, "/tmp/vero-leak-dir/inner"):
        for name in ("vero-leak.txt", "answer.txt"):
            try:
                found[f"{place}/{name}"] = Path(place, name).read_text()
            except OSError:
                pass
    libc = _libc()
    segment = libc.shmget(SHM_KEY, 0, 0)
    if segment >= 0:
        libc.shmat.restype = ctypes.c_void_p
        address = libc.shmat(segment, None, 0o10000)  # SHM_RDONLY
        found["shm"] = ctypes.string_at(address).decode(errors="replace")
    return found


def _call(token: str) -> int:
    from openai import APIStatusError, OpenAI

    client = OpenAI(api_key=token, max_retries=0, timeout=60)
    try:
        client.chat.completions.create(
            model="gpt-4o-mini", max_tokens=20, messages=[{"role": "user", "content": "hello"}]
        )
        return 200
    except APIStatusError as exc:
        return exc.status_code


def _steal() -> dict:
    mine = os.environ["OPENAI_API_KEY"]
    tag = hashlib.sha256(mine.encode()).hexdigest()[:12]
    board = Path(PUBLIC)
    (board / f"token-{tag}-{os.getpid()}").write_text(mine)
    os.chmod(board / f"token-{tag}-{os.getpid()}", 0o644)
    report: dict = {"own": _call(mine)}
    deadline = time.monotonic() + 150
    foreign = None
    while foreign is None and time.monotonic() < deadline:
        for path in board.glob("token-*"):
            text = path.read_text().strip()
            if text and text != mine:
                foreign = text
        time.sleep(0.2)
    report["found_foreign"] = foreign is not None
    if foreign is not None:
        report["foreign"] = _call(foreign)
        report["own_after"] = _call(mine)
    (board / f"done-{tag}-{os.getpid()}").write_text("done")
    # Stay alive (and keep this evaluation's token valid) until the other evaluation has tried too.
    while time.monotonic() < deadline and not [p for p in board.glob("done-*") if not p.name.startswith(f"done-{tag}")]:
        time.sleep(0.2)
    return report


class CrossingCandidate(BaseAgent):
    @staticmethod
    def name() -> str:
        return "crossing-candidate"

    def version(self) -> str:
        return MODE

    async def setup(self, environment) -> None:
        return None

    async def run(self, instruction, environment, context) -> None:
        import asyncio

        report: dict = {"mode": MODE, "uid": os.getuid()}
        if MODE == "leak":
            data = await environment.exec("cat /app/*.txt 2>/dev/null; ls -la /app")
            report["left"] = _leak(f"VERO-LEAK\n{instruction}\n{data.stdout}")
        elif MODE == "read":
            report["found"] = _read()
        elif MODE == "steal":
            report["steal"] = await asyncio.to_thread(_steal)
        elif MODE == "sleep":
            await asyncio.sleep(SLEEP_SEC)
        (self.logs_dir / "report.json").write_text(json.dumps(report, indent=1))
