"""A confined candidate host's way to its gateway: TCP inside its network namespace, a unix socket across.

A host in its own network namespace (`vero.harbor.boundary.namespaces`) has only a loopback, so
its gateway listener (in the sidecar's or verifier's namespace) is reached through two relays that
meet at unix sockets in the host's scratch dir (a unix socket with a path is found through the file
system, which both namespaces share there):

- `relay out <dir> <address:port>...`: started by the launcher as the host's uid in the trusted
  process's network namespace (so the network fence and the gateway's caller check see the host's
  uid, as for an unconfined host), outside the host's pid namespace (the candidate cannot see or
  signal it); listens on `<dir>/<port>.sock` and connects each accepted stream to `address:port`;
- `relay in <dir> [--ready-fd=N] <port>...`: started in the host's namespaces as its uid; listens
  on `127.0.0.1:<port>`, writes `1` to descriptor N once it does, and connects each accepted stream
  to `<dir>/<port>.sock` (retrying while the outer end starts).

Bytes pass unchanged both ways until either side closes. Both ends are killed with the host's
uid; the candidate can stop or replace its own relay, which cuts only its own gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

__all__ = ["main"]

_CHUNK = 1 << 16
_CONNECT_TIMEOUT_SEC = 10.0

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _splice(opener: Opener, inner: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    reader, writer = inner
    try:
        far_reader, far_writer = await opener()
    except (OSError, TimeoutError):
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
    finally:
        for each in (writer, far_writer):
            each.close()
            with contextlib.suppress(ConnectionError, OSError):
                await each.wait_closed()


def _handler(opener: Opener) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _splice(opener, (reader, writer))

    return handle


async def _open_unix(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The outer end may still be starting: retry until `_CONNECT_TIMEOUT_SEC`."""
    deadline = asyncio.get_running_loop().time() + _CONNECT_TIMEOUT_SEC
    while True:
        try:
            return await asyncio.open_unix_connection(path)
        except (FileNotFoundError, ConnectionRefusedError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _serve_out(directory: Path, targets: list[str]) -> None:
    directory.mkdir(mode=0o700, exist_ok=True)
    servers = []
    for target in targets:
        address, port = target.rsplit(":", 1)

        def opener(address: str = address, port: int = int(port)) -> Awaitable:
            return asyncio.wait_for(asyncio.open_connection(address, port), _CONNECT_TIMEOUT_SEC)

        path = directory / f"{int(port)}.sock"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        servers.append(await asyncio.start_unix_server(_handler(opener), path=str(path)))
    await asyncio.gather(*(server.serve_forever() for server in servers))


async def _serve_in(directory: Path, ports: list[int], ready_fd: int | None) -> None:
    servers = []
    for port in ports:
        path = str(directory / f"{port}.sock")

        def opener(path: str = path) -> Awaitable:
            return _open_unix(path)

        servers.append(await asyncio.start_server(_handler(opener), "127.0.0.1", port))
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python -I -S relay.py (out|in) <dir> <target>...`."""
    args = sys.argv[1:] if argv is None else argv
    os.umask(0o077)
    direction, directory, rest = args[0], Path(args[1]), args[2:]
    if direction == "out":
        asyncio.run(_serve_out(directory, rest))
    elif direction == "in":
        ready = [int(a.removeprefix("--ready-fd=")) for a in rest if a.startswith("--ready-fd=")]
        ports = [int(a) for a in rest if not a.startswith("--")]
        asyncio.run(_serve_in(directory, ports, ready[0] if ready else None))
    else:
        raise SystemExit(f"relay: unknown direction {direction!r}")


if __name__ == "__main__":
    main()
