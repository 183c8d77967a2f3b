"""A `kind: agent` candidate that tries to leave its candidate host over the network.

Run by `tests/e2e/fence/scenario.py` (in the compiled sidecar image, behind the real network
fence) with `VERO_FENCE_TARGETS` naming what to attack (JSON: `main` the address of a container
standing in for `main`, its TCP and UDP ports, `loopback` a port of a root listener beside the
sidecar's other listeners, `api` the sidecar-style API port). It calls its own gateway (which must
work), then tries: TCP and UDP to `main`, ICMP to `main`, the loopback listener and the API port,
DNS (Docker's resolver), IPv6 loopback and IPv4-mapped IPv6, and finally listens on TCP and UDP
ports for `main` to reach. It prints one line `FENCE-REPORT <json>` on stderr (the launcher keeps
the host's stderr) and never raises.

Its instruction says which host it is (`tests/e2e/fence/scenario.py` starts three): `leave:<marker>`
first leaves the marker in every shared place it can write (`namespace_probe.write`: files in
`/tmp`, `/var/tmp`, `/dev/shm`, a POSIX queue, a SysV segment, an abstract unix socket), keeps
them while it probes and listens, and reports its own view (`namespace`); `look:<marker>` (a host
alive at the same time, and a later one) only reports its view (`NS-REPORT <json>`), looking for
the marker and for the trusted paths in `VERO_FENCE_TARGETS["hidden"]`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request

from harbor.agents.base import BaseAgent
from namespace_probe import view, write

LISTEN_SEC = 25.0


def _tcp(family: int, address: tuple, payload: bytes = b"VERO-FENCE-LEAK") -> str:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect(address)
        sock.sendall(payload)
        return "connected"
    except OSError as exc:
        return f"denied: {type(exc).__name__}"
    finally:
        sock.close()


def _udp(address: tuple) -> str:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.sendto(b"VERO-FENCE-LEAK", address)
        return "sent"
    except OSError as exc:
        return f"denied: {type(exc).__name__}"
    finally:
        sock.close()


def _icmp(host: str) -> str:
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError as exc:
        return f"denied: {type(exc).__name__}"
    try:
        sock.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", (host, 0))  # echo request, checksum filled in
        return "sent"
    except OSError as exc:
        return f"denied: {type(exc).__name__}"
    finally:
        sock.close()


def _dns(name: str) -> str:
    try:
        socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
        return "resolved"
    except OSError as exc:
        return f"denied: {type(exc).__name__}"


def _gateway() -> str:
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/models", headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return f"{response.status} {json.loads(response.read())['data'][0]['id']}"
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        return f"failed: {type(exc).__name__}: {exc}"


def _listen(tcp_port: int, udp_port: int) -> dict:
    """Hold a TCP and a UDP port for `LISTEN_SEC`, counting what arrives from anywhere."""
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", tcp_port))
    tcp.listen(0)  # the smallest backlog: SYN cookies early, as an attacker would want
    tcp.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", udp_port))
    udp.settimeout(0.5)
    accepted = received = 0
    deadline = time.monotonic() + LISTEN_SEC
    while time.monotonic() < deadline:
        try:
            connection, _ = tcp.accept()
            accepted += 1
            connection.close()
        except OSError:
            pass
        try:
            udp.recvfrom(100)
            received += 1
        except OSError:
            pass
    tcp.close()
    udp.close()
    return {"tcp_accepted": accepted, "udp_received": received}


class FenceCandidate(BaseAgent):
    @staticmethod
    def name() -> str:
        return "fence-candidate"

    def version(self) -> str:
        return "1"

    async def setup(self, environment) -> None:
        return None

    async def run(self, instruction, environment, context) -> None:
        targets = json.loads(os.environ["VERO_FENCE_TARGETS"])
        mode, _, marker = instruction.partition(":")
        if mode == "look":
            print("NS-REPORT " + json.dumps(view(marker, targets["hidden"])), flush=True, file=sys.stderr)
            return
        held = write(marker)
        main = targets["main"]
        report = {
            "namespace": view(marker, targets["hidden"]),
            "uid": os.getuid(),
            "gateway": _gateway(),
            "main_tcp": _tcp(socket.AF_INET, (main, targets["main_tcp"])),
            "main_udp": _udp((main, targets["main_udp"])),
            "main_icmp": _icmp(main),
            "loopback_tcp": _tcp(socket.AF_INET, ("127.0.0.1", targets["loopback"])),
            "api_tcp": _tcp(socket.AF_INET, ("127.0.0.1", targets["api"])),
            "dns": _dns(targets["main_name"]),
            "dns_udp": _udp(("127.0.0.11", 53)),
            "ipv6_loopback": _tcp(socket.AF_INET6, ("::1", targets["loopback"])),
            "ipv4_mapped": _tcp(socket.AF_INET6, (f"::ffff:{main}", targets["main_tcp"])),
        }
        print("FENCE-LISTENING", flush=True, file=sys.stderr)
        report["listen"] = _listen(targets["listen_tcp"], targets["listen_udp"])
        print("FENCE-REPORT " + json.dumps(report), flush=True, file=sys.stderr)
        del held
