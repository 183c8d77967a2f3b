"""HTTP/1.1 over one plain socket, for what a client library hides: whether a server keeps reading
a connection after an answer (an oversized body read to its end leaves the connection usable; one
closed with unread data is reset, and the client loses the answer)."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

__all__ = ["post_then_get", "statuses_on_one_connection"]


def statuses_on_one_connection(
    url: str, requests: list[bytes], *, timeout_sec: float = 60.0, pieces: int = 1, pace_sec: float = 0.0
) -> list[int]:
    """Send `requests` back to back on one connection; the statuses of the answers read, in order.

    The requests are written from a thread while the answers are read, so a server that answers
    before reading a body does not deadlock the test; with `pieces` > 1 each request goes in that
    many parts, `pace_sec` apart (a slow client, or a slow network). A connection that is closed
    or reset ends the list early (an answer lost to a reset is not in it).
    """
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_sec)

    def write() -> None:
        try:
            for request in requests:
                step = -(len(request) // -pieces)
                for start in range(0, len(request), step):
                    sock.sendall(request[start : start + step])
                    if pace_sec:
                        time.sleep(pace_sec)
        except OSError:
            pass  # closed or reset by the server: the reader sees it too

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    statuses: list[int] = []
    stream = sock.makefile("rb")
    try:
        for _ in requests:
            try:
                status = _read_answer(stream)
            except (OSError, ValueError):
                break
            if status is None:
                break
            statuses.append(status)
    finally:
        writer.join(timeout_sec)
        stream.close()
        sock.close()
    return statuses


def _read_answer(stream) -> int | None:
    """One HTTP/1.1 answer from `stream` (Content-Length or chunked body); its status, or None at EOF."""
    line = stream.readline()
    if not line:
        return None
    status = int(line.split()[1])
    headers = {}
    while (header := stream.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while (size := int(stream.readline().split(b";")[0], 16)) > 0:
            stream.read(size + 2)
        stream.readline()
    else:
        stream.read(int(headers.get("content-length", "0")))
    return status


def post_then_get(
    url: str,
    post_path: str,
    body: bytes | list[bytes],
    get_path: str,
    *,
    pieces: int = 1,
    pace_sec: float = 0.0,
    **headers: str,
) -> list[int]:
    """A POST of `body` (bytes: with Content-Length; a list: chunked) then a GET, on one connection
    (`pieces`, `pace_sec`: sent slowly, see `statuses_on_one_connection`)."""
    host = urlsplit(url).netloc
    extra = "".join(f"{name.replace('_', '-')}: {value}\r\n" for name, value in headers.items())
    if isinstance(body, bytes):
        head = f"POST {post_path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n{extra}"
        post = (head + f"content-length: {len(body)}\r\n\r\n").encode() + body
    else:
        head = f"POST {post_path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n{extra}"
        chunks = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in body)
        post = (head + "transfer-encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
    get = f"GET {get_path} HTTP/1.1\r\nhost: {host}\r\n{extra}\r\n".encode()
    return statuses_on_one_connection(url, [post, get], pieces=pieces, pace_sec=pace_sec)
