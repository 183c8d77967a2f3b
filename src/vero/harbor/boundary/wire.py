"""Framing of the pipe between the trusted candidate agent and the candidate host process.

One frame is a 4-byte big-endian header length, a UTF-8 JSON object (the header), and, when the
header has `"size": n`, `n` raw payload bytes (file contents, a tar stream). Both limits are checked
before anything is read into memory, so a hostile peer can never make the other side allocate
more than `MAX_HEADER_BYTES` plus the payload limit the reader passes.

Only the standard library is imported: the candidate host imports this module before it imports
anything of the candidate (and before Harbor).
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

__all__ = ["MAX_HEADER_BYTES", "FrameError", "FrameWriter", "read_frame"]

MAX_HEADER_BYTES = 1 << 20
"""Largest JSON header accepted (bytes); headers carry commands, paths and exec output cut to size."""

_LENGTH = struct.Struct(">I")


class FrameError(ConnectionError):
    """The peer sent something that is not a frame of this protocol (or too large); the pipe is dropped."""


async def read_frame(reader: asyncio.StreamReader, max_payload_bytes: int) -> tuple[dict[str, Any], bytes]:
    """Read one frame.

    Returns:
        The header (a dict) and the payload (`b""` without one).

    Raises:
        FrameError: malformed header, a header over `MAX_HEADER_BYTES`, a payload over
            `max_payload_bytes`.
        asyncio.IncompleteReadError: the peer closed the pipe mid-frame or before one.
    """
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_HEADER_BYTES:
        raise FrameError("frame header too large")
    try:
        header = json.loads(await reader.readexactly(length))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FrameError("frame header is not JSON") from None
    if not isinstance(header, dict):
        raise FrameError("frame header is not an object")
    size = header.get("size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FrameError("frame size is not a non-negative integer")
    if size > max_payload_bytes:
        raise FrameError("frame payload too large")
    payload = await reader.readexactly(size) if size else b""
    return header, payload


class FrameWriter:
    """Writes whole frames; concurrent senders are serialized so frames never interleave."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Send `header` (JSON-encodable) and an optional payload.

        Raises:
            FrameError: the encoded header is over `MAX_HEADER_BYTES`.
            ConnectionError: the peer is gone.
        """
        if payload:
            header = {**header, "size": len(payload)}
        data = json.dumps(header, separators=(",", ":")).encode()
        if len(data) > MAX_HEADER_BYTES:
            raise FrameError("frame header too large")
        async with self._lock:
            self._writer.write(_LENGTH.pack(len(data)) + data)
            if payload:
                self._writer.write(payload)
            await self._writer.drain()

    def close(self) -> None:
        self._writer.close()
