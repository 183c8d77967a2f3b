"""Who is calling the gateway: the owner of a TCP connection's other end, when it is in this host.

A gateway token must work only from where its evaluation's candidate runs (docs/inference.md).
Candidate hosts are processes of throw-away uids in this container (`vero.harbor.boundary`), so a
call over loopback (or to this container's own address on a case network) comes from a socket of
this network namespace, and the kernel says whose: `/proc/net/tcp` and `/proc/net/tcp6` list every
TCP socket of the namespace with its local and remote address and the uid that created it
(Linux `proc_net_tcp(5)`; a uid cannot create a socket as another, and a connection's 4-tuple is
unique). A call from a case container has no socket here.

`peer_of(client, server)` looks the connection up from the server's side: the row whose local
address is the client's and whose remote address is the server's.

- `Peer(local=True, uid=N)`: a live socket of uid N in this namespace;
- `Peer(local=True, uid=None)`: such a connection exists but has no owner any more (a socket its
  process closed, `TIME_WAIT`/orphaned, shown with inode 0): nobody to trust;
- `Peer(local=False, uid=None)`: no such socket here: the caller is another host or container.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Peer", "peer_of"]

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@dataclass(frozen=True)
class Peer:
    """The calling end of a connection (see the module docstring)."""

    local: bool
    uid: int | None


def _address(field: str) -> tuple[str, int]:
    """`0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6) -> (address, port)."""
    host, port = field.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word of the address in host byte order.
    words = b"".join(struct.pack("=I", int.from_bytes(raw[i : i + 4], "big")) for i in range(0, len(raw), 4))
    if len(words) == 4:
        return socket.inet_ntop(socket.AF_INET, words), int(port, 16)
    address = ipaddress.IPv6Address(words)
    mapped = address.ipv4_mapped
    return (str(mapped) if mapped is not None else str(address)), int(port, 16)


def _normal(host: str) -> str:
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def peer_of(client: tuple[str, int], server: tuple[str, int], tables: tuple[Path, ...] = _TABLES) -> Peer:
    """Who holds the client end of the connection `client` -> `server` (addresses as the server saw
    them: the request's client and server address and port)."""
    want_local = (_normal(client[0]), int(client[1]))
    want_remote = (_normal(server[0]), int(server[1]))
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            try:
                local, remote = _address(fields[1]), _address(fields[2])
            except ValueError:
                continue
            if local != want_local or remote != want_remote:
                continue
            if fields[9] == "0":  # no socket file any more: its owner is gone
                return Peer(local=True, uid=None)
            return Peer(local=True, uid=int(fields[7]))
    return Peer(local=False, uid=None)
