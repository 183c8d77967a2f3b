"""Serve an ASGI app in a benchmark's child process, as `vero harbor serve` configures uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def serve_and_report(app: Any, conn: Any, reply: Callable[[int], object] = lambda port: port) -> None:
    """Serve `app` on 127.0.0.1 at a free port (lifespan on, no access log) until the process is
    stopped; once it listens, send `reply(port)` over `conn` (a multiprocessing Connection), or None
    if the server ended before it listened."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning", access_log=False)
    )

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                conn.send(None)
                return
            await asyncio.sleep(0.02)
        conn.send(reply(server.servers[0].sockets[0].getsockname()[1]))
        await task

    asyncio.run(main())
