"""The emulator's `modal` package: the part of Modal's SDK Harbor 0.26 and vero call, backed by the
emulator's control service (`modal_emulator.service`) instead of Modal.

It is test infrastructure, never vero's runtime path: it is found only where `PYTHONPATH` names
`tests/modal_emulator/sdk` (the tests do that for the host's `harbor run`; the emulator does it for
its sandboxes, where a real sandbox would have the real SDK installed from the package index).

Surface (what `harbor/environments/modal.py` and `vero.harbor.leftovers` use, nothing more):

- `App.lookup(name, create_if_missing=False)` -> an app with `app_id`;
- `Image.from_registry(tag, secret=None)`, `Image.from_aws_ecr(tag, secret=None)`,
  `Image.from_dockerfile(path, context_dir=None)`, `image.dockerfile_commands(*commands)`: lazy
  recipes, built by the service when a sandbox needs them (the "registry" is the local engine);
- `Secret.from_dict(env)`, `Secret.from_name(name)`; `Volume.from_name(name, create_if_missing=False)`;
- `Sandbox.create(*entrypoint, app, image, timeout, idle_timeout, name, block_network, secrets,
  volumes, cpu, memory, gpu, runtime, experimental_options, tags, region, outbound_*_allowlist,
  unencrypted_ports)`, `Sandbox.from_id`, `Sandbox.list(app_id=, tags=)` (running sandboxes only);
- `sandbox.exec(*args, workdir=, secrets=, timeout=, text=)` -> a process whose `stdout`/`stderr`
  have `read()`, with `wait()`, `poll()`, `returncode` (a command past its `timeout` is killed
  and returns -1, as Modal's processes do); `sandbox.poll()`, `wait(raise_on_termination=)`,
  `terminate()`, `detach()`, `returncode`, `object_id`;
- `sandbox.filesystem.copy_from_local(local, remote)` (parents created), `copy_to_local(remote,
  local)`, `list_files(path)`, `read_text(path)`, `write_text(text, path)`, `remove(path)`;
- `sandbox._experimental_set_outbound_network_policy(outbound_domain_allowlist=,
  outbound_cidr_allowlist=)`: only the fully open policy is emulated.

Every method also has its `.aio` form. Anything else is absent (an `AttributeError`), and what the
service cannot emulate (GPUs, tunnels, egress allow-lists) raises `NotSupportedError`.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from modal import exception
from modal._client import call, dual

__all__ = ["App", "ContainerProcess", "Image", "Sandbox", "Secret", "Volume", "exception"]

__version__ = "1.6.0+vero-emulator"


class App:
    """A Modal app: a namespace for sandboxes (Harbor's is `__harbor__`)."""

    def __init__(self, app_id: str, name: str) -> None:
        self.app_id = app_id
        self.name = name

    @dual
    def lookup(cls, name: str, *, create_if_missing: bool = False, environment_name: str | None = None) -> App:
        answer = call("POST", "/v1/apps/lookup", json={"name": name, "create_if_missing": create_if_missing})
        return cls(answer["app_id"], name)


class Secret:
    """Environment variables for a sandbox or a command: a dict, or a named secret of the service."""

    def __init__(self, env: dict[str, str | None] | None = None, name: str | None = None) -> None:
        self.env = env
        self.name = name

    @staticmethod
    def from_dict(env: dict[str, str | None]) -> Secret:
        return Secret(env={str(k): (None if v is None else str(v)) for k, v in env.items()})

    @staticmethod
    def from_name(name: str, *, environment_name: str | None = None, required_keys: Any = None) -> Secret:
        return Secret(name=name)

    def wire(self) -> dict[str, Any]:
        return {"env": self.env} if self.name is None else {"name": self.name}


class Volume:
    """A named volume (a Docker volume of the emulator)."""

    def __init__(self, name: str, create_if_missing: bool) -> None:
        self.name = name
        self.create_if_missing = create_if_missing

    @staticmethod
    def from_name(name: str, *, create_if_missing: bool = False, environment_name: str | None = None) -> Volume:
        return Volume(name, create_if_missing)


def _context_tar(dockerfile: Path, context_dir: Path) -> bytes:
    """The build context as a tar (links kept as links), the Dockerfile as `.vero-emulator.Dockerfile`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(context_dir.rglob("*")):
            archive.add(path, arcname=path.relative_to(context_dir).as_posix(), recursive=False)
        archive.add(dockerfile, arcname=".vero-emulator.Dockerfile", recursive=False)
    return buffer.getvalue()


class Image:
    """A lazy image recipe; the service builds it when a sandbox is created from it."""

    def __init__(self, recipe: dict[str, Any], context: bytes | None = None, parent: Image | None = None) -> None:
        self._recipe = recipe
        self._context = context
        self._parent = parent
        self.object_id: str | None = None

    @staticmethod
    def from_registry(tag: str, *, secret: Secret | None = None, **_: Any) -> Image:
        return Image({"kind": "registry", "tag": tag, "secret": secret.wire() if secret else None})

    @staticmethod
    def from_aws_ecr(tag: str, *, secret: Secret | None = None, **_: Any) -> Image:
        return Image({"kind": "registry", "tag": tag, "secret": secret.wire() if secret else None, "ecr": True})

    @staticmethod
    def from_dockerfile(path: str | Path, *, context_dir: str | Path | None = None, **_: Any) -> Image:
        dockerfile = Path(path)
        context = Path(context_dir) if context_dir is not None else dockerfile.parent
        return Image({"kind": "dockerfile"}, context=_context_tar(dockerfile, context))

    def dockerfile_commands(self, *commands: str | list[str], **_: Any) -> Image:
        lines: list[str] = []
        for command in commands:
            lines.extend([command] if isinstance(command, str) else command)
        return Image({"kind": "commands", "commands": lines}, parent=self)

    def _hydrate(self) -> str:
        """Build (or find) the image on the service; its id."""
        if self.object_id is None:
            recipe = dict(self._recipe)
            if self._parent is not None:
                recipe["parent"] = self._parent._hydrate()
            if self._context is not None:
                recipe["context_b64"] = base64.b64encode(self._context).decode()
            self.object_id = call("POST", "/v1/images", json=recipe)["image_id"]
        return self.object_id


class _Stream:
    """`process.stdout` / `process.stderr`: read everything once the command has ended."""

    def __init__(self, process: ContainerProcess, which: str) -> None:
        self._process = process
        self._which = which

    @dual
    def read(self) -> bytes | str:
        data = base64.b64decode(self._process._finished()[self._which])
        return data.decode("utf-8", errors="replace") if self._process._text else data


class ContainerProcess:
    """A command running in a sandbox (`Sandbox.exec`)."""

    def __init__(self, exec_id: str, text: bool) -> None:
        self.object_id = exec_id
        self._text = text
        self._result: dict[str, Any] | None = None
        self._lock = threading.Lock()  # Harbor reads stdout, stderr and the status at once
        self.stdout = _Stream(self, "stdout")
        self.stderr = _Stream(self, "stderr")

    def _finished(self) -> dict[str, Any]:
        with self._lock:
            while self._result is None:
                answer = call("GET", f"/v1/execs/{self.object_id}", params={"wait_sec": 50})
                if answer["done"]:
                    self._result = answer
            return self._result

    @property
    def returncode(self) -> int | None:
        return self._result["returncode"] if self._result is not None else None

    @dual
    def wait(self) -> int:
        return int(self._finished()["returncode"])

    @dual
    def poll(self) -> int | None:
        with self._lock:
            if self._result is None:
                answer = call("GET", f"/v1/execs/{self.object_id}", params={"wait_sec": 0})
                if answer["done"]:
                    self._result = answer
        return self.returncode


class _Filesystem:
    """`sandbox.filesystem`."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def _path(self, name: str) -> str:
        return f"/v1/sandboxes/{self._sandbox.object_id}/{name}"

    @dual
    def copy_from_local(self, local_path: str | Path, remote_path: str | PurePosixPath) -> None:
        local = Path(local_path)
        params = {"path": str(remote_path), "mode": f"{local.stat().st_mode & 0o7777:o}"}
        call("PUT", self._path("file"), content=local.read_bytes(), params=params)

    @dual
    def copy_to_local(self, remote_path: str | PurePosixPath, local_path: str | Path) -> None:
        data = call("GET", self._path("file"), params={"path": str(remote_path)})
        target = Path(local_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    @dual
    def list_files(self, path: str | PurePosixPath) -> list[str]:
        return list(call("GET", self._path("list"), params={"path": str(path)})["entries"])

    @dual
    def read_text(self, path: str | PurePosixPath) -> str:
        return call("GET", self._path("file"), params={"path": str(path)}).decode()

    @dual
    def write_text(self, text: str, path: str | PurePosixPath) -> None:
        call("PUT", self._path("file"), content=text.encode(), params={"path": str(path), "mode": "644"})

    @dual
    def remove(self, path: str | PurePosixPath, recursive: bool = False) -> None:
        call("POST", self._path("remove"), json={"path": str(path), "recursive": recursive})


def _secrets(secrets: list[Secret] | None) -> list[dict[str, Any]]:
    return [s.wire() for s in secrets or []]


class Sandbox:
    """A sandbox: one container on the local Docker engine (with its own dockerd for DinD images)."""

    def __init__(self, sandbox_id: str) -> None:
        self.object_id = sandbox_id
        self.filesystem = _Filesystem(self)
        self._returncode: int | None = None

    @dual
    def create(
        cls,
        *entrypoint_args: str,
        app: App | None = None,
        image: Image | None = None,
        timeout: int | None = None,
        idle_timeout: int | None = None,
        name: str | None = None,
        block_network: bool = False,
        secrets: list[Secret] | None = None,
        volumes: dict[str, Volume] | None = None,
        cpu: float | tuple[float, float] | None = None,
        memory: int | tuple[int, int] | None = None,
        gpu: str | None = None,
        runtime: str | None = None,
        experimental_options: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
        region: str | list[str] | None = None,
        outbound_domain_allowlist: list[str] | None = None,
        outbound_cidr_allowlist: list[str] | None = None,
        unencrypted_ports: list[int] | None = None,
        encrypted_ports: list[int] | None = None,
        workdir: str | None = None,
    ) -> Sandbox:
        if app is None:
            raise exception.InvalidError("Sandbox.create needs an app (App.lookup)")
        image = image or Image.from_registry("debian:trixie-slim")
        body = {
            "app_id": app.app_id,
            "image_id": image._hydrate(),
            "entrypoint": list(entrypoint_args),
            "timeout": timeout,
            "idle_timeout": idle_timeout,
            "name": name,
            "block_network": block_network,
            "secrets": _secrets(secrets),
            "volumes": {
                path: {"name": v.name, "create_if_missing": v.create_if_missing} for path, v in (volumes or {}).items()
            },
            "cpu": list(cpu) if isinstance(cpu, tuple) else cpu,
            "memory": list(memory) if isinstance(memory, tuple) else memory,
            "gpu": gpu,
            "runtime": runtime,
            "experimental_options": experimental_options or {},
            "tags": {str(k): str(v) for k, v in (tags or {}).items()},
            "region": region,
            "outbound_domain_allowlist": outbound_domain_allowlist,
            "outbound_cidr_allowlist": outbound_cidr_allowlist,
            "ports": list(unencrypted_ports or []) + list(encrypted_ports or []),
            "workdir": workdir,
            "sandbox_v2": os.environ.get("MODAL_SANDBOX_V2") == "1",
        }
        return cls(call("POST", "/v1/sandboxes", json=body)["sandbox_id"])

    @dual
    def from_id(cls, sandbox_id: str) -> Sandbox:
        call("GET", f"/v1/sandboxes/{sandbox_id}")
        return cls(sandbox_id)

    @staticmethod
    def _list(app_id: str | None, tags: dict[str, str] | None) -> list[Sandbox]:
        params: dict[str, str] = {"app_id": app_id or ""}
        params.update({f"tag.{k}": str(v) for k, v in (tags or {}).items()})
        return [Sandbox(sid) for sid in call("GET", "/v1/sandboxes", params=params)["sandbox_ids"]]

    class _Lister:
        """`Sandbox.list(...)` iterates; `Sandbox.list.aio(...)` iterates asynchronously."""

        def __call__(self, *, app_id: str | None = None, tags: dict[str, str] | None = None, **_: Any):
            return iter(Sandbox._list(app_id, tags))

        async def aio(self, *, app_id: str | None = None, tags: dict[str, str] | None = None, **_: Any):
            import asyncio

            for sandbox in await asyncio.to_thread(Sandbox._list, app_id, tags):
                yield sandbox

    list = _Lister()

    @dual
    def exec(
        self,
        *args: str,
        workdir: str | None = None,
        secrets: list[Secret] | None = None,
        timeout: int | None = None,
        text: bool = True,
        **_: Any,
    ) -> ContainerProcess:
        body = {"args": list(args), "workdir": workdir, "secrets": _secrets(secrets), "timeout": timeout}
        answer = call("POST", f"/v1/sandboxes/{self.object_id}/exec", json=body)
        return ContainerProcess(answer["exec_id"], text)

    @dual
    def poll(self) -> int | None:
        self._returncode = call("GET", f"/v1/sandboxes/{self.object_id}")["returncode"]
        return self._returncode

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @dual
    def wait(self, raise_on_termination: bool = True) -> None:
        while True:
            answer = call("GET", f"/v1/sandboxes/{self.object_id}", params={"wait_sec": 50})
            if answer["returncode"] is not None:
                break
        self._returncode = answer["returncode"]
        if raise_on_termination and answer["ended_by"] == "terminate":
            raise exception.SandboxTerminatedError(f"sandbox {self.object_id} was terminated")
        if raise_on_termination and answer["ended_by"] == "timeout":
            raise exception.SandboxTimeoutError(f"sandbox {self.object_id} ran out of its lifetime")

    @dual
    def terminate(self) -> None:
        call("POST", f"/v1/sandboxes/{self.object_id}/terminate")

    @dual
    def detach(self) -> None:
        return None

    @dual
    def tunnels(self, timeout: int = 50) -> dict[int, Any]:
        raise exception.NotSupportedError("the Modal emulator has no tunnels (Harbor's --stream needs them)")

    @dual
    def _experimental_set_outbound_network_policy(
        self,
        *,
        outbound_domain_allowlist: list[str] | None = None,
        outbound_cidr_allowlist: list[str] | None = None,
    ) -> None:
        call(
            "POST",
            f"/v1/sandboxes/{self.object_id}/network-policy",
            json={
                "outbound_domain_allowlist": outbound_domain_allowlist,
                "outbound_cidr_allowlist": outbound_cidr_allowlist,
            },
        )
