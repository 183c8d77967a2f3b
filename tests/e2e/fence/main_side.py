"""The stand-in for `main` in `test_candidate_fence_e2e.py` (run in its own container).

`main_side.py listen <tcp> <udp>`: what a coding agent would run to receive a leak: a TCP and a UDP
listener; every payload received is printed as a JSON line (`docker logs` reads them).
`main_side.py probe <host> <port>...`: tries to connect to each port of the sidecar stand-in
(a candidate's listener, a port nobody holds, the API) and prints one JSON line with the outcome
per port: what the agent in `main` could learn about the candidate's ports.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

_PRINT = threading.Lock()


def _record(entry: dict) -> None:
    with _PRINT:  # one line per payload: the TCP and UDP threads print at once
        sys.stdout.write(json.dumps(entry) + "\n")
        sys.stdout.flush()


def listen(tcp_port: int, udp_port: int) -> None:
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", tcp_port))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", udp_port))

    def tcp_loop() -> None:
        while True:
            connection, peer = tcp.accept()
            connection.settimeout(5)
            try:
                data = connection.recv(1000)
            except OSError:
                data = b""
            _record({"tcp": data.decode(errors="replace"), "from": peer[0]})
            connection.close()

    threading.Thread(target=tcp_loop, daemon=True).start()
    while True:
        data, peer = udp.recvfrom(1000)
        _record({"udp": data.decode(errors="replace"), "from": peer[0]})


def probe(host: str, ports: list[int]) -> None:
    outcomes = {}
    for port in ports:
        sock = socket.socket()
        sock.settimeout(3)
        started = time.monotonic()
        try:
            sock.connect((host, port))
            outcomes[str(port)] = "connected"
        except OSError as exc:
            outcomes[str(port)] = type(exc).__name__
        finally:
            sock.close()
        outcomes[f"{port}_sec"] = round(time.monotonic() - started, 1)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.connect((host, port))
        udp.settimeout(1.5)
        try:  # a closed UDP port answers ICMP port unreachable, seen as ConnectionRefusedError
            udp.send(b"VERO-FENCE-PROBE")
            udp.recv(100)
            outcomes[f"{port}_udp"] = "answered"
        except OSError as exc:
            outcomes[f"{port}_udp"] = type(exc).__name__
        finally:
            udp.close()
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen(int(sys.argv[2]), int(sys.argv[3]))
    else:
        probe(sys.argv[2], [int(p) for p in sys.argv[3:]])
