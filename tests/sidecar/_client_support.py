"""Helpers for the client and CLI tests: count what reaches the real sidecar, inject what a proxy or
an overloaded server would answer, and start a sidecar on a port that refuses connections until it
starts listening.

The sidecar itself is the real app from `tests.sidecar._server` (the shared harness).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

__all__ = ["Answer", "CountingApp", "bound_port", "serve_later"]


@dataclass(frozen=True)
class Answer:
    method: str
    path: str
    status: int


class CountingApp:
    """ASGI wrapper around the real app.

    Records every request when it arrives (`arrivals`) and when its answer starts (`answers`).
    `faults[(method, path)]` is a queue of statuses: while non-empty, such a request is answered
    with the next status and a plain-text body and never reaches the app (a proxy's or an
    overloaded server's answer). `answer_delays_sec[(method, path)]` holds the response of such a
    request back after the app produced it (the server acted; the answer comes late).
    """

    def __init__(self, app) -> None:
        self.app = app
        self.state = app.state  # `ServerThread` reads `startup_error` from here
        self.arrivals: list[tuple[str, str]] = []
        self.answers: list[Answer] = []
        self.faults: dict[tuple[str, str], list[int]] = {}
        self.answer_delays_sec: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def arrived(self, method: str, path: str) -> int:
        """How many `method path` requests reached the server."""
        with self._lock:
            return sum(1 for item in self.arrivals if item == (method, path))

    def arrived_prefix(self, method: str, prefix: str) -> int:
        with self._lock:
            return sum(1 for m, p in self.arrivals if m == method and p.startswith(prefix))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = (scope["method"], scope["path"])
        with self._lock:
            self.arrivals.append(key)
            queue = self.faults.get(key)
            fault = queue.pop(0) if queue else None
        delay_sec = self.answer_delays_sec.get(key, 0.0)

        async def recording_send(message) -> None:
            if message["type"] == "http.response.start":
                if delay_sec:
                    await asyncio.sleep(delay_sec)
                with self._lock:
                    self.answers.append(Answer(*key, message["status"]))
            await send(message)

        if fault is not None:
            body = f"injected {fault}".encode()
            await recording_send(
                {
                    "type": "http.response.start",
                    "status": fault,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, recording_send)


@contextmanager
def bound_port() -> Iterator[socket.socket]:
    """A loopback TCP socket bound to a free port but not listening: connecting to it is refused
    (Linux answers RST), and no other process can take the port meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock
    finally:
        sock.close()


@contextmanager
def serve_later(app, delay_sec: float) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serve `app` on a port that refuses connections for `delay_sec` seconds, then listens.

    Yields the base URL at once (before the server listens) and the uvicorn server.
    """
    with bound_port() as sock:
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", timeout_graceful_shutdown=30))

        def run() -> None:
            time.sleep(delay_sec)
            try:
                server.run(sockets=[sock])  # asyncio's create_server calls listen() on it
            except SystemExit:
                pass

        thread = threading.Thread(target=run, name="sidecar-started-late", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{port}", server
        finally:
            server.should_exit = True
            thread.join(60)
