"""Who is calling the gateway: the owner of a TCP connection's other end, when it is in this host.

A gateway token must work only from where its evaluation's candidate runs (docs/inference.md).
Candidate hosts are processes of throw-away uids in this container (`vero.harbor.boundary`), so a
call over loopback (or to this container's own address on a case network) comes from a socket of
this network namespace, and the kernel says whose: `/proc/net/tcp` and `/proc/net/tcp6` list every
TCP socket of the namespace with its local and remote address and the uid that created it
(Linux `proc_net_tcp(5)`; a uid cannot create a socket as another, and a connection's 4-tuple is
unique). A call from a case container has no socket here.

`peer_of(client, server)` looks the connection up from the server's side: the socket whose local
address is the client's and whose remote address is the server's. It asks the kernel for that one
socket over netlink (`sock_diag(7)`: an exact lookup by address and port, some microseconds, over
one socket opened once), so neither the number of connections nor a process out of descriptors
changes the answer; where netlink is refused it reads the tables (a scan of every socket, which
needs a descriptor per look).

- `Peer(local=True, uid=N)`: a live socket of uid N in this namespace;
- `Peer(local=True, uid=None)`: such a connection exists but has no owner any more (a socket its
  process closed, `TIME_WAIT`/orphaned, shown with inode 0): nobody to trust;
- `Peer(local=False, uid=None)`: no such socket here: the caller is another host or container.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import threading
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


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_UID_OFFSET = 16 + 64  # netlink header, then `inet_diag_msg` up to `idiag_uid` (linux/inet_diag.h)


class _SockDiag:
    """One netlink socket asking the kernel for single TCP sockets by address (`sock_diag(7)`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._seq = 0
        self.checked: bool | None = None

    def _open(self) -> socket.socket:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
            self._socket.settimeout(1.0)
        return self._socket

    def works(self) -> bool:
        """Whether lookups here find a connection of this process (checked once: a kernel without
        `inet_diag` would answer "no such socket" for every one, and refuse every caller)."""
        if self.checked is None:
            try:
                with (
                    socket.create_server(("127.0.0.1", 0)) as server,
                    socket.create_connection(server.getsockname(), timeout=1.0) as client,
                ):
                    found = self.find(client.getsockname(), server.getsockname())
                    self.checked = found.local and found.uid is not None
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    # Out of descriptors now (a candidate may hold them): no verdict on netlink;
                    # cached, it would send every later lookup to the tables for good.
                    return False
                self.checked = False
        return self.checked

    def find(self, client: tuple[str, int], server: tuple[str, int]) -> Peer:
        """The owner of the socket bound to `client` and connected to `server`.

        Raises:
            OSError: netlink cannot answer (e.g. refused in this container): read the tables.
        """
        family = socket.AF_INET6 if ":" in client[0] or ":" in server[0] else socket.AF_INET
        addresses = [_packed(family, host) for host in (client[0], server[0])]
        sockid = struct.pack("!HH", client[1], server[1]) + addresses[0] + addresses[1]
        sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
        request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
        with self._lock:
            nl = self._open()
            self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
            nl.send(struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0) + request)
            while True:
                data = nl.recv(8192)
                _, kind, _, got = struct.unpack_from("=IHHI", data)
                if got == seq:
                    break
        if kind == _NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, 16)[0]
            if code == errno.ENOENT:
                return Peer(local=False, uid=None)
            raise OSError(code, "sock_diag lookup failed")
        uid, inode = struct.unpack_from("=II", data, _UID_OFFSET)
        return Peer(local=True, uid=None if inode == 0 else uid)


def _packed(family: int, host: str) -> bytes:
    address = ipaddress.ip_address(host)
    if family == socket.AF_INET6 and isinstance(address, ipaddress.IPv4Address):
        address = ipaddress.IPv6Address(f"::ffff:{address}")
    return address.packed.ljust(16, b"\0")


_DIAG = _SockDiag()


def peer_of(client: tuple[str, int], server: tuple[str, int], tables: tuple[Path, ...] = _TABLES) -> Peer:
    """Who holds the client end of the connection `client` -> `server` (addresses as the server saw
    them: the request's client and server address and port). A lookup that cannot be made at all
    answers `Peer(local=False, uid=None)`: nobody to trust (the caller is refused)."""
    if tables is _TABLES and _DIAG.works():
        try:
            return _DIAG.find((_normal(client[0]), int(client[1])), (_normal(server[0]), int(server[1])))
        except (OSError, struct.error):
            return Peer(local=False, uid=None)
    return _scan(client, server, tables)


def _scan(client: tuple[str, int], server: tuple[str, int], tables: tuple[Path, ...]) -> Peer:
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
