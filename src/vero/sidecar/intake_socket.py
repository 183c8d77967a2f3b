"""The intake socket: a Unix socket on a volume shared with `main`, where `main`'s collect hook closes intake.

Harbor 0.26 runs the compiled task's hook in `main` (as root) right after the agent phase
(`vero.sidecar.intake`). The hook used to call `http://eval-sidecar:8000/intake/close`, which needs
a fresh outbound TCP connection from `main`; a process the agent left there could make that fail
by holding every ephemeral port of `main`'s network namespace (a bound socket per port: `curl`
exits 7 at once), and intake then stayed open until the seal. A Unix socket needs no port, no
address and no name lookup: the hook runs `curl --unix-socket <path> -X POST http://intake/intake/close`.

The socket lives in its own named volume (`CONTAINER_PATHS.intake_socket`'s directory), mounted in
both services. `bind_intake_socket` makes the directory root-only (0700) and the socket 0600, so in
`main` only root (the hook) can connect, not the agent's uid; in this container the candidate
hosts' uids cannot either. `IntakeSocketGuard` serves nothing over it but `POST /intake/close`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from vero.errors import InfrastructureFailure
from vero.sidecar.errors import problem_response

__all__ = ["INTAKE_CLOSE_PATH", "IntakeSocketGuard", "bind_intake_socket"]

INTAKE_CLOSE_PATH = "/intake/close"
"""The one route served over the intake socket."""


def bind_intake_socket(path: Path) -> socket.socket:
    """Bind the intake socket at `path` (a stale one from an earlier process is replaced).

    Its directory is made 0700 before the bind, so the socket is never reachable by another uid
    while its own mode is still the umask's; then the socket itself is made 0600.

    Returns:
        The bound (not yet listening) `AF_UNIX` stream socket, for uvicorn's `sockets`.

    Raises:
        InfrastructureFailure: the directory cannot be prepared or the socket cannot be bound.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        path.unlink(missing_ok=True)
        sock.bind(str(path))
        os.chmod(path, 0o600)
    except OSError as exc:
        sock.close()
        raise InfrastructureFailure(
            f"the sidecar could not listen on its intake socket {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    return sock


def _over_unix_socket(scope: Scope) -> bool:
    # uvicorn gives a Unix socket's connections `server = (path, None)` and no client address.
    server = scope.get("server")
    return server is not None and server[1] is None


class IntakeSocketGuard:
    """Answer 404 to everything over the intake socket but `POST /intake/close`.

    Only root in `main` can reach the socket, yet the socket is for the hook's one call: the agent
    surface stays on TCP, where `LocalCallerGuard` and the network fence apply.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or not _over_unix_socket(scope):
            await self.app(scope, receive, send)
        elif scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
        elif scope["method"] == "POST" and scope["path"] == INTAKE_CLOSE_PATH:
            await self.app(scope, receive, send)
        else:
            await problem_response(404, f"the intake socket serves only POST {INTAKE_CLOSE_PATH}")(scope, receive, send)
