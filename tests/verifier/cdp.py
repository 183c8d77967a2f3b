"""Drive headless Chromium over the DevTools protocol (websockets), capturing console output exactly.

Used by the report test: load a page, collect every console message, uncaught exception and log
entry (blocked loads and CSP violations arrive as `Log.entryAdded` errors), evaluate expressions,
take a screenshot. Chromium is Debian's `chromium`; the caller skips when the binary is absent.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1200,1800",
)


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageRun:
    console: list[dict[str, Any]] = field(default_factory=list)
    """`Runtime.consoleAPICalled` params (type, args)."""
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    """`Log.entryAdded` entries (level, source, text)."""

    def errors(self) -> list[str]:
        found = [
            f"console.{m['type']}: {[a.get('value') for a in m.get('args', [])]}"
            for m in self.console
            if m["type"] in ("error", "assert", "warning")
        ]
        found += [f"exception: {e.get('exceptionDetails', {}).get('text')}" for e in self.exceptions]
        found += [
            f"log {e['entry']['level']}: {e['entry'].get('text')}"
            for e in self.logs
            if e["entry"]["level"] in ("error", "warning")
        ]
        return found


class _Connection:
    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.events: asyncio.Queue = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            if "id" in message and message["id"] in self.pending:
                self.pending.pop(message["id"]).set_result(message)
            else:
                await self.events.put(message)

    async def send(self, method: str, params: dict | None = None, session_id: str | None = None) -> dict:
        message_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        payload: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session_id:
            payload["sessionId"] = session_id
        await self.ws.send(json.dumps(payload))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})


@asynccontextmanager
async def chromium(binary: str, user_data_dir: Path):
    user_data_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = user_data_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        async with websockets.connect(f"ws://127.0.0.1:{port}{path}", max_size=None) as ws:
            connection = _Connection(ws)
            try:
                yield connection
            finally:
                try:
                    await connection.send("Browser.close")
                except Exception:  # noqa: BLE001 - the browser may already be gone
                    pass
                connection.reader.cancel()
    finally:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def load_page(
    binary: str,
    url: str,
    user_data_dir: Path,
    *,
    screenshot: Path,
    expressions: dict[str, str],
    settle_sec: float = 1.0,
) -> tuple[PageRun, dict[str, Any]]:
    """Open `url`, wait for `load`, let it settle, evaluate `expressions`, save a PNG screenshot."""
    run = PageRun()
    values: dict[str, Any] = {}
    async with chromium(binary, user_data_dir) as browser:
        target = await browser.send("Target.createTarget", {"url": "about:blank"})
        attached = await browser.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        session = attached["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            await browser.send(f"{domain}.enable", session_id=session)
        await browser.send("Page.navigate", {"url": url}, session_id=session)

        loaded = False
        deadline = time.monotonic() + 30

        async def drain(until: float) -> None:
            nonlocal loaded
            while time.monotonic() < until:
                try:
                    event = await asyncio.wait_for(browser.events.get(), max(0.05, until - time.monotonic()))
                except TimeoutError:
                    return
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.consoleAPICalled":
                    run.console.append(params)
                elif method == "Runtime.exceptionThrown":
                    run.exceptions.append(params)
                elif method == "Log.entryAdded":
                    run.logs.append(params)
                elif method == "Page.loadEventFired":
                    loaded = True
                    return

        while not loaded and time.monotonic() < deadline:
            await drain(deadline)
        if not loaded:
            raise RuntimeError("the page did not fire its load event")
        await drain(time.monotonic() + settle_sec)
        for name, expression in expressions.items():
            reply = await browser.send(
                "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session_id=session
            )
            values[name] = reply.get("result", {}).get("value")
        shot = await browser.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session_id=session
        )
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        await drain(time.monotonic() + 0.2)
    return run, values
