"""An emulated Modal on the local Docker engine: the part of Modal's API that Harbor 0.26's
`ModalEnvironment` (`harbor/environments/modal.py`) uses, so that vero's Modal path runs end to end
here, where no Modal account can be reached. Test infrastructure: never on vero's runtime path.

Three parts:

- `sdk/modal`: a `modal` package with the SDK surface Harbor and vero call (its docstring lists
  it). A process uses it when `PYTHONPATH` names `SDK_PATH`; it talks to the control service at
  `MODAL_SERVER_URL` with the token pair `MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET`.
- `service.ControlService`: the control service (FastAPI); it checks the token pair on every call.
- `engine.Engine`: sandboxes as containers on the local engine, compose sandboxes with their own
  dockerd (DinD slots), images from the local engine.

`ModalEmulator` runs the service (uvicorn in a thread) on the host's address on the emulator's own
Docker network, so the host, every sandbox and every container inside a DinD sandbox reach it at
the same URL: a nested `harbor run -e modal` in a sidecar or verifier sandbox uses the same
emulator. Run it by hand with `PYTHONPATH=tests uv run python -m modal_emulator` (it prints the
variables to export).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from modal_emulator.engine import SDK_DIR, Engine
from modal_emulator.service import ControlService, ExecHook, SandboxRecord

__all__ = ["SDK_PATH", "ModalEmulator", "SandboxRecord"]

SDK_PATH: Path = SDK_DIR
"""The directory to put on `PYTHONPATH` for the emulator's `modal` package."""


class ModalEmulator:
    """One emulator instance: its network, control service and sandboxes (a context manager).

    Args:
        preload: engine images given to DinD sandboxes' dockerds (what the tasks' Dockerfiles name).
    """

    def __init__(self, preload: Sequence[str] = ("python:3.13-slim",)) -> None:
        self.instance = secrets.token_hex(4)
        self.token_id = f"ak-emu-{secrets.token_hex(12)}"
        self.token_secret = f"as-emu-{secrets.token_hex(16)}"
        self.engine = Engine(self.instance, preload=preload)
        self.service = ControlService(self.engine, self.token_id, self.token_secret)
        self.port = _free_port(self.engine.gateway)
        self.url = f"http://{self.engine.gateway}:{self.port}"
        self._server = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ModalEmulator:
        import uvicorn

        config = uvicorn.Config(
            self.service.app, host=self.engine.gateway, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="modal-emulator")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the Modal emulator's control service did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Terminate every sandbox still running, stop the service, remove what it made."""
        self.service.close()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.engine.close()

    def env(self) -> dict[str, str]:
        """The variables a client process needs: the service URL, the token pair, `PYTHONPATH`."""
        return {
            "MODAL_SERVER_URL": self.url,
            "MODAL_TOKEN_ID": self.token_id,
            "MODAL_TOKEN_SECRET": self.token_secret,
            "PYTHONPATH": str(SDK_PATH),
        }

    def sandboxes(self) -> list[SandboxRecord]:
        """Every sandbox created so far, in creation order (running or ended)."""
        return sorted(self.service.sandboxes.values(), key=lambda r: r.created_at)

    def running(self, tags: dict[str, str] | None = None) -> list[SandboxRecord]:
        """The sandboxes still running, those whose tags include `tags` if given."""
        wanted = (tags or {}).items()
        return [r for r in self.sandboxes() if r.running and wanted <= r.tags.items()]

    @contextlib.contextmanager
    def before_exec(self, hook: ExecHook) -> Iterator[None]:
        """Run `hook(sandbox, argv)` before each command a sandbox is asked to run, while inside."""
        self.service.before_exec = hook
        try:
            yield
        finally:
            self.service.before_exec = None

    def inner_services(self, sandbox: SandboxRecord) -> dict[str, str]:
        """Compose service -> its running inner container's id, in a DinD sandbox (tests' probes)."""
        assert sandbox.container_id is not None
        return self.engine.inner_services(sandbox.container_id)

    def inner_exec(
        self,
        sandbox: SandboxRecord,
        service: str,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes = b"",
        inner_id: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run `argv` in Compose service `service` inside a DinD sandbox (for tests' probes)."""
        assert sandbox.container_id is not None
        return self.engine.inner_exec(sandbox.container_id, service, argv, user=user, stdin=stdin, inner_id=inner_id)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
