"""A lean HTTP/1.1 client for benchmarks that load the sidecar from many connections at once.

One `H11Connection` is one keep-alive TCP connection (asyncio streams) speaking HTTP/1.1 through
`h11`, the protocol library under uvicorn and httpx, with none of httpx's pooling, retries or
timeouts. On two cores the client shares the CPU with the sidecar it measures: 64 evaluations
through `httpx.AsyncClient` cost the benchmark process 1.2-1.5 s of CPU a round, through this
0.06-0.13 s (docs/benchmarks.md, fan-out).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11


class H11Connection:
    """One keep-alive connection to `host:port`; one request at a time.

    Raises on use: ConnectionError when the server closes the connection mid-response,
    h11.ProtocolError on a malformed response.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._h11 = h11.Connection(h11.CLIENT)

    async def open(self) -> None:
        """Connect (before the measured part, as a pool's warm connections would be)."""
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, target: str, body: Any = None) -> tuple[int, Any]:
        """Send one request (`body` as JSON if given); returns (status, the JSON body or None)."""
        assert self._reader is not None and self._writer is not None, "open() first"
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        headers = [("Host", f"{self.host}:{self.port}")]
        data = b"" if body is None else json.dumps(body).encode()
        if body is not None:
            headers += [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        out = self._h11.send(h11.Request(method=method, target=target, headers=headers)) or b""
        if data:
            out += self._h11.send(h11.Data(data=data)) or b""
        self._writer.write(out + (self._h11.send(h11.EndOfMessage()) or b""))
        status, chunks = 0, []
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                received = await self._reader.read(65536)
                if not received:
                    raise ConnectionError(f"{self.host}:{self.port} closed the connection mid-response")
                self._h11.receive_data(received)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                raw = b"".join(chunks)
                return status, json.loads(raw) if raw else None

    async def close(self) -> None:
        """Close the connection."""
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()
