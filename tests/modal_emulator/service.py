"""The Modal emulator's control service: the API the emulator's `modal` client calls.

A FastAPI app (`ControlService.app`) over `engine.Engine`. Every call must carry the instance's
token pair (`x-modal-token-id`, `x-modal-token-secret`; compared in constant time), or it is
answered 401 `AuthError`: so only a process that was given the token can create, list, run or
end anything. Errors are `{"error": <modal.exception class>, "message": ...}`.

What it emulates of Modal's semantics, and where it says no instead of pretending:

- apps by name (`create_if_missing`), sandboxes by id, name (unique among an app's running
  sandboxes) and tags; `list` returns running sandboxes whose tags include the asked ones;
- a sandbox's lifetime (`timeout`, default Modal's 300 s) is enforced: past it the sandbox is
  ended (`ended_by: timeout`); `terminate` ends it at once, and both read as exit 137;
- a command past its own `timeout` is killed and returns -1;
- `block_network` runs the sandbox without a network; `cpu`/`memory` limits become the
  container's; `region` is recorded only;
- refused (`NotSupportedError`): GPUs, ports/tunnels, `idle_timeout`, outbound allow-lists other
  than "everything", experimental options other than `enable_docker`.

Every sandbox is recorded (`SandboxRecord`: who created it from which address, its tags, runtime,
image, when it ended and how), so tests can say what ran where and that nothing is left.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import secrets as token_secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from modal_emulator.engine import RUNTIME_SLOTS, Built, DindSlot, Engine, EngineError, acquire_slot

logger = logging.getLogger("modal_emulator")

DEFAULT_SANDBOX_TIMEOUT_SEC = 300
"""Modal's default sandbox lifetime (5 minutes) when `Sandbox.create` gives none."""
_OPEN_DOMAINS = (None, ["*"])
_OPEN_CIDRS = (None, ["0.0.0.0/0"])


class ApiError(Exception):
    """An answer naming a `modal.exception` class."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def _not_supported(what: str) -> ApiError:
    return ApiError(400, "NotSupportedError", f"the Modal emulator does not emulate {what}")


@dataclass
class SandboxRecord:
    """One sandbox, as the service saw it (kept after it ended)."""

    id: str
    app_id: str
    name: str | None
    tags: dict[str, str]
    image: str
    dind: bool
    runtime: str
    caller: str
    created_at: float
    timeout_sec: int
    region: Any = None
    created_by: str = "host"
    """The running sandbox the create call came from (its address), else `host`."""
    address: str | None = None
    container_id: str | None = None
    returncode: int | None = None
    ended_by: str | None = None
    ended_at: float | None = None
    slot: DindSlot | None = field(default=None, repr=False)
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def running(self) -> bool:
        return self.returncode is None


@dataclass
class ExecRecord:
    id: str
    sandbox_id: str
    argv: list[str]
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    returncode: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    finished_at: float | None = None


class SecretWire(BaseModel):
    env: dict[str, str | None] | None = None
    name: str | None = None


class LookupBody(BaseModel):
    name: str
    create_if_missing: bool = False


class ImageBody(BaseModel):
    kind: str
    tag: str | None = None
    secret: SecretWire | None = None
    ecr: bool = False
    commands: list[str] = Field(default_factory=list)
    parent: str | None = None
    context_b64: str | None = None


class VolumeWire(BaseModel):
    name: str
    create_if_missing: bool = False


class CreateBody(BaseModel):
    app_id: str
    image_id: str
    entrypoint: list[str] = Field(default_factory=list)
    timeout: int | None = None
    idle_timeout: int | None = None
    name: str | None = None
    block_network: bool = False
    secrets: list[SecretWire] = Field(default_factory=list)
    volumes: dict[str, VolumeWire] = Field(default_factory=dict)
    cpu: float | list[float] | None = None
    memory: int | list[int] | None = None
    gpu: str | None = None
    runtime: str | None = None
    experimental_options: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    region: Any = None
    outbound_domain_allowlist: list[str] | None = None
    outbound_cidr_allowlist: list[str] | None = None
    ports: list[int] = Field(default_factory=list)
    workdir: str | None = None
    sandbox_v2: bool = False


class ExecBody(BaseModel):
    args: list[str]
    workdir: str | None = None
    secrets: list[SecretWire] = Field(default_factory=list)
    timeout: int | None = None


class RemoveBody(BaseModel):
    path: str
    recursive: bool = False


class PolicyBody(BaseModel):
    outbound_domain_allowlist: list[str] | None = None
    outbound_cidr_allowlist: list[str] | None = None


ExecHook = Callable[["SandboxRecord", list[str]], None]
"""Called (in a worker thread) before each command a sandbox is asked to run; may run its own
commands in the sandbox first (the tests' probes). Its errors are logged, never raised."""


class ControlService:
    """The service's state and routes (see the module docstring).

    Args:
        engine: the Docker side.
        token_id, token_secret: the only token pair accepted.
        named_secrets: `Secret.from_name` names -> their variables.
    """

    def __init__(
        self, engine: Engine, token_id: str, token_secret: str, named_secrets: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.engine = engine
        self.token_id = token_id
        self.token_secret = token_secret
        self.named_secrets = dict(named_secrets or {})
        self.apps: dict[str, str] = {}
        self.images: dict[str, Built] = {}
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.execs: dict[str, ExecRecord] = {}
        self.before_exec: ExecHook | None = None
        self.refused_calls = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="modal-emulator")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.app = self._build_app()

    # -- helpers ---------------------------------------------------------------------------------

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _env(self, secrets: list[SecretWire]) -> dict[str, str]:
        env: dict[str, str] = {}
        for secret in secrets:
            if secret.name is not None:
                if secret.name not in self.named_secrets:
                    raise ApiError(404, "NotFoundError", f"secret {secret.name!r} not found")
                env.update(self.named_secrets[secret.name])
            else:
                env.update({k: v for k, v in (secret.env or {}).items() if v is not None})
        return env

    def _forget_old_execs(self, keep_sec: float = 600) -> None:
        """Drop finished commands' outputs after `keep_sec` (a client reads them at once)."""
        now = time.monotonic()
        for exec_id, execution in list(self.execs.items()):
            if execution.finished_at is not None and now - execution.finished_at > keep_sec:
                self.execs.pop(exec_id, None)

    def _sandbox(self, sandbox_id: str) -> SandboxRecord:
        record = self.sandboxes.get(sandbox_id)
        if record is None:
            raise ApiError(404, "NotFoundError", f"sandbox {sandbox_id} not found")
        return record

    def _running(self, sandbox_id: str) -> SandboxRecord:
        record = self._sandbox(sandbox_id)
        if not record.running or record.container_id is None:
            raise ApiError(409, "NotFoundError", f"sandbox {sandbox_id} is not running")
        return record

    def _end(self, record: SandboxRecord, returncode: int, ended_by: str) -> None:
        """Mark a sandbox ended (first cause wins), release its slot, remove its container."""
        with self._lock:
            if record.returncode is not None:
                return
            record.returncode, record.ended_by, record.ended_at = returncode, ended_by, time.time()
        if record.container_id is not None:
            self.engine.remove(record.container_id)
        if record.slot is not None:
            record.slot.release()
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(record.ended.set)

    def _watch(self, record: SandboxRecord) -> None:
        assert record.container_id is not None
        code = self.engine.wait_exit(record.container_id)
        self._end(record, code, "exit")

    # -- the app ---------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="vero's Modal emulator")
        service = self

        @app.middleware("http")
        async def tokens(request: Request, call_next):
            if service._loop is None:
                service._loop = asyncio.get_running_loop()
            given_id = request.headers.get("x-modal-token-id", "")
            given_secret = request.headers.get("x-modal-token-secret", "")
            if not (
                hmac.compare_digest(given_id.encode(), service.token_id.encode())
                and hmac.compare_digest(given_secret.encode(), service.token_secret.encode())
            ):
                service.refused_calls += 1
                return JSONResponse({"error": "AuthError", "message": "invalid Modal token pair"}, status_code=401)
            try:
                return await call_next(request)
            except ApiError as exc:
                return JSONResponse({"error": exc.error, "message": exc.message}, status_code=exc.status)

        @app.exception_handler(ApiError)
        async def api_error(request: Request, exc: ApiError):
            return JSONResponse({"error": exc.error, "message": exc.message}, status_code=exc.status)

        @app.exception_handler(EngineError)
        async def engine_error(request: Request, exc: EngineError):
            return JSONResponse({"error": "InternalError", "message": str(exc)}, status_code=500)

        @app.post("/v1/apps/lookup")
        async def lookup(body: LookupBody):
            with service._lock:
                if body.name not in service.apps:
                    if not body.create_if_missing:
                        raise ApiError(404, "NotFoundError", f"app {body.name!r} not found")
                    service.apps[body.name] = f"ap-{token_secrets.token_hex(8)}"
                return {"app_id": service.apps[body.name]}

        @app.post("/v1/images")
        async def image(body: ImageBody):
            built = await service._blocking(service._build_image, body)
            image_id = f"im-{token_secrets.token_hex(8)}"
            service.images[image_id] = built
            return {"image_id": image_id}

        @app.post("/v1/sandboxes")
        async def create(body: CreateBody, request: Request):
            caller = request.client.host if request.client else ""
            record = await service._blocking(service._create, body, caller)
            return {"sandbox_id": record.id}

        @app.get("/v1/sandboxes")
        async def list_sandboxes(request: Request):
            params = request.query_params
            app_id = params.get("app_id") or None
            wanted = {k[len("tag.") :]: v for k, v in params.items() if k.startswith("tag.")}
            found = [
                r.id
                for r in list(service.sandboxes.values())
                if r.running and (app_id is None or r.app_id == app_id) and wanted.items() <= r.tags.items()
            ]
            return {"sandbox_ids": found}

        @app.get("/v1/sandboxes/{sandbox_id}")
        async def sandbox_state(sandbox_id: str, wait_sec: float = 0):
            record = service._sandbox(sandbox_id)
            if record.running and wait_sec > 0:
                try:
                    await asyncio.wait_for(record.ended.wait(), timeout=min(wait_sec, 55))
                except TimeoutError:
                    pass
            return {"returncode": record.returncode, "ended_by": record.ended_by}

        @app.post("/v1/sandboxes/{sandbox_id}/terminate")
        async def terminate(sandbox_id: str):
            record = service._sandbox(sandbox_id)
            await service._blocking(service._end, record, 137, "terminate")
            return {}

        @app.post("/v1/sandboxes/{sandbox_id}/exec")
        async def start_exec(sandbox_id: str, body: ExecBody):
            record = service._running(sandbox_id)
            env = service._env(body.secrets)
            execution = ExecRecord(id=f"ex-{token_secrets.token_hex(8)}", sandbox_id=sandbox_id, argv=body.args)
            service._forget_old_execs()
            service.execs[execution.id] = execution
            loop = asyncio.get_running_loop()
            loop.run_in_executor(service._pool, service._run_exec, record, execution, env, body)
            return {"exec_id": execution.id}

        @app.get("/v1/execs/{exec_id}")
        async def exec_state(exec_id: str, wait_sec: float = 0):
            execution = service.execs.get(exec_id)
            if execution is None:
                raise ApiError(404, "NotFoundError", f"process {exec_id} not found")
            if not execution.done.is_set() and wait_sec > 0:
                try:
                    await asyncio.wait_for(execution.done.wait(), timeout=min(wait_sec, 55))
                except TimeoutError:
                    pass
            if not execution.done.is_set():
                return {"done": False}
            return {
                "done": True,
                "returncode": execution.returncode,
                "stdout": base64.b64encode(execution.stdout).decode(),
                "stderr": base64.b64encode(execution.stderr).decode(),
            }

        @app.put("/v1/sandboxes/{sandbox_id}/file")
        async def put_file(sandbox_id: str, request: Request, path: str, mode: str = "644"):
            record = service._running(sandbox_id)
            data = await request.body()
            await service._blocking(service.engine.put_file, record.container_id, path, data, int(mode, 8) & 0o7777)
            return {}

        @app.get("/v1/sandboxes/{sandbox_id}/file")
        async def get_file(sandbox_id: str, path: str):
            record = service._running(sandbox_id)
            try:
                data = await service._blocking(service.engine.get_file, record.container_id, path)
            except IsADirectoryError:
                raise ApiError(400, "SandboxFilesystemIsADirectoryError", f"{path} is a directory") from None
            if data is None:
                raise ApiError(404, "SandboxFilesystemNotFoundError", f"{path} not found")
            return Response(content=data, media_type="application/octet-stream")

        @app.get("/v1/sandboxes/{sandbox_id}/list")
        async def list_files(sandbox_id: str, path: str):
            record = service._running(sandbox_id)
            script = 'if [ -d "$1" ]; then ls -A1 "$1"; elif [ -e "$1" ]; then exit 20; else exit 21; fi'
            code, out, _ = await service._blocking(
                lambda: service.engine.exec(
                    record.container_id, ["sh", "-c", script, "ls", path], env={}, workdir=None, timeout_sec=60
                )
            )
            if code == 20:
                raise ApiError(400, "SandboxFilesystemNotADirectoryError", f"{path} is not a directory")
            if code != 0:
                raise ApiError(404, "SandboxFilesystemNotFoundError", f"{path} not found")
            return {"entries": [line for line in out.decode(errors="replace").splitlines() if line]}

        @app.post("/v1/sandboxes/{sandbox_id}/remove")
        async def remove(sandbox_id: str, body: RemoveBody):
            record = service._running(sandbox_id)
            await service._blocking(
                lambda: service.engine.exec(
                    record.container_id,
                    ["rm", "-rf" if body.recursive else "-f", "--", body.path],
                    env={},
                    workdir=None,
                    timeout_sec=120,
                )
            )
            return {}

        @app.post("/v1/sandboxes/{sandbox_id}/network-policy")
        async def network_policy(sandbox_id: str, body: PolicyBody):
            service._running(sandbox_id)
            if body.outbound_domain_allowlist not in _OPEN_DOMAINS or body.outbound_cidr_allowlist not in _OPEN_CIDRS:
                raise _not_supported("outbound allow-lists (only the open network)")
            return {}

        return app

    # -- work (in worker threads) -----------------------------------------------------------------

    def _build_image(self, body: ImageBody) -> Built:
        if body.secret is not None:
            self._env([body.secret])  # a registry secret must exist; the local registry needs none
        if body.kind == "registry" and body.tag:
            return self.engine.registry(body.tag)
        if body.kind == "dockerfile" and body.context_b64 is not None:
            return self.engine.build_dockerfile(base64.b64decode(body.context_b64))
        if body.kind == "commands" and body.parent in self.images:
            return self.engine.build_commands(self.images[body.parent], body.commands)
        raise ApiError(400, "InvalidError", f"cannot build image recipe {body.kind!r}")

    def _create(self, body: CreateBody, caller: str) -> SandboxRecord:
        if body.app_id not in self.apps.values():
            raise ApiError(404, "NotFoundError", f"app {body.app_id} not found")
        image = self.images.get(body.image_id)
        if image is None:
            raise ApiError(404, "NotFoundError", f"image {body.image_id} not found")
        if body.gpu:
            raise _not_supported("GPUs")
        if body.ports:
            raise _not_supported("ports and tunnels")
        if body.idle_timeout is not None:
            raise _not_supported("idle timeouts")
        if body.outbound_domain_allowlist not in _OPEN_DOMAINS or body.outbound_cidr_allowlist not in _OPEN_CIDRS:
            raise _not_supported("outbound allow-lists (only the open network, or block_network)")
        if set(body.experimental_options) - {"enable_docker"}:
            raise _not_supported(f"experimental options {sorted(set(body.experimental_options) - {'enable_docker'})}")
        if body.runtime not in (None, "vm"):
            raise ApiError(400, "InvalidError", f"unknown runtime {body.runtime!r}")
        docker_ok = body.runtime == "vm" or bool(body.experimental_options.get("enable_docker"))
        env = self._env(body.secrets)
        volumes = {}
        for path, volume in body.volumes.items():
            name = f"vero-modal-emu-{self.engine.instance}-vol-{volume.name}"
            try:
                self.engine.client.volumes.get(name)
            except Exception:  # noqa: BLE001 - NotFound (or an engine error: refused the same way)
                if not volume.create_if_missing:
                    raise ApiError(404, "NotFoundError", f"volume {volume.name!r} not found") from None
                self.engine.client.volumes.create(name, labels={"vero-modal-emulator": self.engine.instance})
            volumes[path] = name
        record = SandboxRecord(
            id=f"sb-{token_secrets.token_hex(8)}",
            app_id=body.app_id,
            name=body.name,
            tags=dict(body.tags),
            image=image.ref,
            dind=image.dind and docker_ok,
            runtime="vm" if body.runtime == "vm" else "gvisor",
            caller=caller,
            created_at=time.time(),
            timeout_sec=body.timeout or DEFAULT_SANDBOX_TIMEOUT_SEC,
            region=body.region,
        )
        with self._lock:
            record.created_by = next(
                (r.id for r in self.sandboxes.values() if r.running and r.address and r.address == caller), "host"
            )
            if body.name and any(
                r.running and r.app_id == body.app_id and r.name == body.name for r in self.sandboxes.values()
            ):
                raise ApiError(409, "AlreadyExistsError", f"a running sandbox of this app is named {body.name!r}")
            self.sandboxes[record.id] = record
        try:
            if record.dind:
                record.slot = acquire_slot(self.engine.client, prefer=RUNTIME_SLOTS[record.runtime])
            cpu = body.cpu[-1] if isinstance(body.cpu, list) else body.cpu
            memory = body.memory[-1] if isinstance(body.memory, list) else body.memory
            record.container_id = self.engine.start(
                record.id,
                image,
                entrypoint=body.entrypoint,
                env=env,
                tags=record.tags,
                block_network=body.block_network,
                docker_ok=docker_ok,
                nano_cpus=int(cpu * 1e9) if cpu else None,
                mem_limit_mb=int(memory) if memory else None,
                volumes=volumes,
                workdir=body.workdir,
                slot=record.slot,
            )
            record.address = self.engine.address(record.container_id)
            threading.Thread(target=self._watch, args=(record,), daemon=True, name=f"watch-{record.id}").start()
            if record.dind:
                self.engine.prepare_dind(record.container_id)
        except BaseException:
            self._end(record, 137, "failed")
            raise
        timer = threading.Timer(record.timeout_sec, self._end, args=(record, 137, "timeout"))
        timer.daemon = True
        timer.start()
        logger.info(
            "sandbox %s (%s, %s) for %s, tags %s",
            record.id,
            record.runtime,
            image.ref[:19],
            record.created_by,
            record.tags,
        )
        return record

    def _run_exec(self, record: SandboxRecord, execution: ExecRecord, env: dict[str, str], body: ExecBody) -> None:
        try:
            if self.before_exec is not None:
                try:
                    self.before_exec(record, list(body.args))
                except Exception:  # a probe's failure is the probe's, never the command's
                    logger.exception("the before-exec hook failed")
            assert record.container_id is not None
            code, out, err = self.engine.exec(
                record.container_id, body.args, env=env, workdir=body.workdir, timeout_sec=body.timeout
            )
        except EngineError as exc:
            code, out, err = 137 if not record.running else 126, b"", str(exc).encode()
        execution.returncode, execution.stdout, execution.stderr = code, out, err
        execution.finished_at = time.monotonic()
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(execution.done.set)

    def close(self) -> None:
        for record in list(self.sandboxes.values()):
            if record.running:
                self._end(record, 137, "terminate")
        self._pool.shutdown(wait=False, cancel_futures=True)
