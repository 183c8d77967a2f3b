"""The sidecar's FastAPI app: `create_app` builds it, `serve` runs it under uvicorn.

The app is the API's table of contents: routers (one per resource), error handlers, the MCP
endpoint and the lifespan that starts the `SidecarService` (state, recovery, baseline, token)
and stops it (unfinished jobs failed `interrupted` and refunded). Nothing is module-level: every
`create_app` call gets its own service, so tests run many apps side by side.

| route | who | what |
|---|---|---|
| `GET /health` | agent | liveness |
| `GET /status` | agent | partitions, budgets (unless hidden), jobs, submission, entrance |
| `POST /evaluations` | agent | 202 + `JobView` once the policy passed, the candidate is imported and budget reserved |
| `GET /evaluations/{id}` | agent | `JobView`; 502 when the job failed for infrastructure reasons |
| `POST /submissions` | agent | 201 (recorded) / 200 (unchanged) + `SubmissionView` |
| `POST /mcp` | agent | the agent routes as MCP tools |
| `/inference/openai/v1/...`, `/inference/anthropic/v1/messages` | agent | its own model calls (`inference.agent`) |
| `POST /admin/seal`, `GET /admin/export` | admin (bearer token) | seal, full records |
"""

from __future__ import annotations

import logging
import os
import socket
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from vero import __version__
from vero.harbor.process import RUNNER_USER, runner_identity
from vero.sidecar.agent_inference import AGENT_INFERENCE_PATH, AgentInferenceMount
from vero.sidecar.errors import PROBLEM_RESPONSES, install_error_handlers, problem_response
from vero.sidecar.intake_socket import IntakeSocketGuard, bind_intake_socket
from vero.sidecar.mcp import MCP_PATH, SidecarMCP
from vero.sidecar.paths import SidecarPaths
from vero.sidecar.routes import ROUTERS
from vero.sidecar.service import SidecarService
from vero.spec.compiled import AGENT_UID, SidecarConfig
from vero.spec.environments import uses_compose

if TYPE_CHECKING:
    from vero.harbor.boundary.fence import ServiceListener

__all__ = ["DRAIN_LIMIT_BYTES", "GRACEFUL_SHUTDOWN_SEC", "MAX_REQUEST_BYTES", "SidecarServer", "create_app", "serve"]

_logger = logging.getLogger("vero.sidecar")

MAX_REQUEST_BYTES = 2 * 1024 * 1024
"""Largest request body accepted, in bytes (a full case list of 10 000 names fits)."""

GRACEFUL_SHUTDOWN_SEC = 3  # uvicorn types its timeout_graceful_shutdown as int
"""How long a stopping sidecar waits for requests still being answered (long polls are answered at
once), in seconds; well inside Docker's 10 s stop grace together with the jobs' cleanup."""


class SidecarServer(uvicorn.Server):
    """uvicorn's server that interrupts the sidecar's jobs the moment it is told to stop.

    uvicorn's own order on SIGTERM is: stop accepting, wait for open connections (a long poll holds
    one for up to 60 s), then run the lifespan shutdown. This server first calls
    `SidecarService.begin_stop` (jobs killed, failed `interrupted` and refunded; held long polls
    answered), so the wait for connections is short and the lifespan's `stop` only waits for
    cleanup. Docker's 10 s grace is then enough for the whole stop.
    """

    def __init__(self, config: uvicorn.Config, service: SidecarService) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets=None) -> None:
        try:
            await self.service.begin_stop()
        except Exception as exc:  # noqa: BLE001 - stopping must go on; the lifespan's stop retries
            _logger.error("interrupting jobs at shutdown failed (%s)", type(exc).__name__)
        await super().shutdown(sockets)


class LocalCallerGuard:
    """Answer 403 to the agent surface when the caller is inside this container.

    The agent's surface is for `main`; the only other processes in the sidecar's container that
    could call it are candidate hosts (`vero.harbor.boundary`), and jobs they start would be a
    channel from a candidate that ran on a `none`/`aggregate` partition's cases to the agent. A
    caller is local when its address is loopback or the very address the connection arrived on.
    `/health` (the container's healthcheck) and `/admin/*` (bearer token; `vero harbor seal` runs
    in this container) stay open.

    Under host networking (Harbor's Modal gVisor runtime gives every service `network_mode: host`
    and maps the other services' names to 127.0.0.1: `environments/modal.py`
    `_build_host_network_overlay`) `main` shares this network namespace and calls from loopback
    too. Such a local caller is `main` when the kernel says its socket belongs to `agent_uid`, the
    agent's user in `main` (`vero.inference.callers.peer_of`: the socket table lists the uid that
    created each socket). No process of this container runs as that uid (candidate hosts get
    uids of `CANDIDATE_UID_RANGE`, nested runs the runner's), so nothing here can pass for it;
    any other local caller, root in `main` included, is refused.
    """

    def __init__(self, app: ASGIApp, agent_uid: int | None = None) -> None:
        self.app = app
        self.agent_uid = agent_uid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not (scope["path"] == "/health" or scope["path"].startswith("/admin/")):
            client = scope.get("client") or ("", 0)
            server = scope.get("server") or ("", 0)
            host = client[0]
            local = host.startswith("127.") or host in ("::1", "localhost") or (host and host == server[0])
            if local and not self._is_agent(client, server):
                await problem_response(403, "the agent surface does not answer callers inside the sidecar")(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)

    def _is_agent(self, client: tuple[str, int], server: tuple[str, int]) -> bool:
        if self.agent_uid is None:
            return False
        from vero.inference.callers import peer_of

        try:
            peer = peer_of((client[0], int(client[1])), (server[0], int(server[1])))
        except (ValueError, TypeError):  # not an IP address (an in-process request's made-up server)
            return False
        return peer.local and peer.uid == self.agent_uid


DRAIN_LIMIT_BYTES = 64 * 1024 * 1024
"""Most of an oversized request body read (and dropped) before its 413 is sent, in bytes.

A server that answers before it has read the body closes a connection with unread data, which
the kernel turns into a reset: the client (httpx, curl) then loses the 413 it was sent. Reading the
rest first lets it read the answer, and the connection stays usable. A body larger than this is
cut off (the client may then see a reset)."""


async def drain_request_body(receive: Receive, limit_bytes: int = DRAIN_LIMIT_BYTES) -> bool:
    """Read and drop the rest of an ASGI request body.

    Returns:
        True when the body ended within `limit_bytes`; False when the client went away or sent more.
    """
    drained = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
        if drained > limit_bytes:
            return False


class BodyLimitMiddleware:
    """Answer 413 to bodies over `max_bytes`, by `Content-Length` or while streaming.

    The rest of the body is read first (up to `DRAIN_LIMIT_BYTES`, `drain_request_body`), so the
    client reads a problem body rather than a connection reset.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, exempt_prefix: str | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt_prefix = exempt_prefix
        """Paths under it keep their own limit (the agent's gateway: model requests are larger)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.exempt_prefix and scope["path"].startswith(self.exempt_prefix)):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                if declared is None or declared > self.max_bytes:
                    if declared is not None and declared <= DRAIN_LIMIT_BYTES:
                        await drain_request_body(receive)
                    await problem_response(413, "the request body is too large")(scope, receive, send)
                    return
        size = 0

        async def limited_receive():
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.max_bytes:
                    if message.get("more_body", False):
                        await drain_request_body(receive, DRAIN_LIMIT_BYTES - size)
                    raise HTTPException(413)
            return message

        await self.app(scope, limited_receive, send)


def create_app(
    service: SidecarService,
    *,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    refuse_local_agent_calls: bool = False,
    agent_uid: int | None = AGENT_UID,
) -> FastAPI:
    """The sidecar's app around a built service; the app's lifespan starts and stops it.

    Args:
        service: the service (`SidecarService(config, SidecarPaths(...), backend, ...)`), not started.
        max_request_bytes: larger request bodies are answered 413.
        refuse_local_agent_calls: answer 403 to agent-surface calls from inside this container
            (`LocalCallerGuard`; `serve` sets it: only `main` may use that surface).
        agent_uid: with the guard, a local caller whose socket this uid owns is `main` sharing this
            network namespace (host networking); None refuses every local caller.

    Returns:
        The app; `app.state.service` is `service`. If startup fails, the exception is kept in
        `app.state.startup_error` (uvicorn only logs it) and re-raised by the lifespan.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            await service.start()
        except BaseException as exc:
            app.state.startup_error = exc
            raise
        try:
            yield
        finally:
            try:
                await mcp.close()
            finally:
                await service.stop()

    app = FastAPI(
        title="vero evaluation sidecar",
        version=__version__,
        description="The trusted evaluator of a vero task: evaluations under a split-visibility policy "
        "and a budget, submissions, and sealing. Errors are RFC 9457 problem bodies.",
        lifespan=lifespan,
        responses=PROBLEM_RESPONSES,
    )
    app.state.service = service
    app.state.startup_error = None
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    mcp = SidecarMCP(app)
    app.router.routes.append(Route(MCP_PATH, endpoint=mcp, methods=["POST"]))
    # The coding agent's gateway (`inference.agent`): its own body limit, the gateway's.
    app.mount(AGENT_INFERENCE_PATH, AgentInferenceMount(service.runner))
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes, exempt_prefix=AGENT_INFERENCE_PATH + "/")
    if refuse_local_agent_calls:
        app.add_middleware(LocalCallerGuard, agent_uid=agent_uid)
    return app


def listen_addresses(config: SidecarConfig, host: str) -> list[str] | None:
    """The addresses `serve` binds instead of the wildcard `host`, or None to bind `host` itself.

    With `inference.route_case_services` on Docker, this container later joins one internal network
    per evaluation (the case containers' way to the gateway); a wildcard bind would answer there
    too. So the API binds loopback (the healthcheck, `vero harbor seal`) and the container's
    IPv4 addresses on the networks it is on at start (`main` reaches it there), gateway networks
    left by an earlier process excepted. Outside a container of this engine: None.

    Raises:
        InfrastructureFailure: the Docker engine cannot be asked.
    """
    inference = config.inference
    if (
        inference is None
        or not inference.route_case_services
        or not uses_compose(config.harbor.environment)
        or host not in ("0.0.0.0", "")
    ):
        return None
    from vero.harbor.case_route import service_addresses

    addresses = service_addresses(os.environ)
    return None if addresses is None else ["127.0.0.1", *addresses]


def _bind(addresses: list[str] | None, port: int) -> list[socket.socket] | None:
    if addresses is None:
        return None
    from vero.errors import InfrastructureFailure

    sockets: list[socket.socket] = []
    for address in addresses:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            for bound in sockets:
                bound.close()
            raise InfrastructureFailure(
                f"the sidecar could not listen on {address}:{port}: {exc.strerror or type(exc).__name__}"
            ) from None
        sockets.append(sock)
    _logger.info("listening on %s (port %d) only: case services are routed", ", ".join(addresses), port)
    return sockets


def _with_intake_socket(
    config: uvicorn.Config, sockets: list[socket.socket] | None, intake_socket: Path | None
) -> list[socket.socket] | None:
    """The sockets to serve: the API's (None: uvicorn binds `host:port` itself) and the intake socket.

    uvicorn serves either its own bind or the sockets it is given, so with an intake socket the
    API's socket is bound here as uvicorn would (`Config.bind_socket`).
    """
    if intake_socket is None:
        return sockets
    from vero.errors import InfrastructureFailure

    if sockets is None:
        try:
            sockets = [config.bind_socket()]
        except SystemExit:  # uvicorn logs why and exits when the port cannot be bound
            raise InfrastructureFailure(f"the sidecar could not listen on {config.host}:{config.port}") from None
    return [*sockets, bind_intake_socket(intake_socket)]


@dataclass(frozen=True)
class CandidateGuards:
    """What `vero harbor serve` keeps from the `kind: agent` candidate hosts that run beside it in
    its container (docs/trust-model.md). Both are on in the compiled task; a sidecar run outside a
    container (tests, a developer's machine) turns them off.

    Attributes:
        refuse_local_agent_calls: the agent surface answers 403 to callers inside this container
            (`LocalCallerGuard`).
        fence_network: candidate hosts reach their evaluation's gateway listeners only
            (`vero.harbor.boundary.fence`; needs CAP_NET_ADMIN and nftables); an evaluation whose
            fence cannot be installed fails as an infrastructure failure (refunded).
    """

    refuse_local_agent_calls: bool = True
    fence_network: bool = True


def service_listeners(host: str, port: int, sockets: list[socket.socket] | None) -> list[ServiceListener]:
    """The API's listeners as the network fence admits them from other hosts: the bound addresses
    (loopback left out: the fence never filters it), or the port on every address for a wildcard."""
    from vero.harbor.boundary.fence import ServiceListener

    if sockets is not None:
        bound = [sock.getsockname()[0] for sock in sockets]
        return [ServiceListener(port, address) for address in bound if not address.startswith("127.")]
    if host in ("0.0.0.0", "", "::"):
        return [ServiceListener(port)]
    try:
        return [ServiceListener(port, host)]
    except ValueError:  # a name or an IPv6 address: the port on every address
        return [ServiceListener(port)]


def serve(
    config_path: Path,
    paths: SidecarPaths,
    *,
    host: str,
    port: int,
    runner_user: str = RUNNER_USER,
    guards: CandidateGuards | None = None,
) -> None:
    """Load the config and run the app under uvicorn until it is stopped (SIGINT/SIGTERM), reading
    and writing at `paths`.

    Nested runs execute as `runner_user` when this process is root (`runner_identity`). `guards`
    (default: both on) say what candidate hosts beside it are kept from: the agent surface (`LocalCallerGuard`) and,
    for `kind: agent` evaluations, the network beyond their gateway (`NetworkFence`, which admits
    this API's listeners from other hosts: `service_listeners`). On
    SIGTERM (`SidecarServer`): running jobs are interrupted at once (process groups killed, failed
    `interrupted`, refunded), held long polls are answered, their leftovers removed, then the
    process exits, within a few seconds.

    With `inference.route_case_services` on Docker, a wildcard `host` becomes loopback and this
    container's addresses on its networks at start (`listen_addresses`): the case networks it joins
    later for the gateway (`vero.harbor.case_route`) never reach this API.

    Raises:
        SpecError: the config cannot be read or validated, or the baseline does not match.
        LedgerCorrupt: durable state is unreadable (the sidecar refuses to start; nothing is reset).
        InfrastructureFailure: a secret of the config is unset or empty, running as root without
            the runner user, a directory cannot be prepared, the port cannot be bound, or (routing
            case services) the Docker engine cannot say which networks this container is on.
    """
    from vero.errors import InfrastructureFailure
    from vero.harbor import HarborBackend
    from vero.spec.compiled import load_config
    from vero.spec.environments import drop_empty_settings

    config = load_config(config_path, SidecarConfig)
    # Secrets arrive by name from the host (compose `${NAME}`, blank when the host lacks them): a
    # sidecar without one would run evaluations that cannot work, so it does not start.
    missing = [name for name in config.secrets if not os.environ.get(name)]
    if missing:
        raise InfrastructureFailure(f"the sidecar's environment lacks the secret(s) {', '.join(missing)}")
    # An unset client setting arrives as "" from compose; the SDKs must see it unset.
    drop_empty_settings(config.settings, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    guards = guards or CandidateGuards()
    sockets = _bind(listen_addresses(config, host), port)
    backend = HarborBackend()
    if guards.fence_network:
        from vero.harbor.boundary.fence import NetworkFence

        backend.confine_candidates(NetworkFence(service=service_listeners(host, port, sockets)))
    service = SidecarService(config, paths, backend, run_as=runner_identity(runner_user))
    app = create_app(service, refuse_local_agent_calls=guards.refuse_local_agent_calls)
    uvicorn_config = uvicorn.Config(
        IntakeSocketGuard(app),
        host=host,
        port=port,
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        log_level="info",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SEC,
    )
    server = SidecarServer(uvicorn_config, app.state.service)
    try:
        server.run(sockets=_with_intake_socket(uvicorn_config, sockets, paths.intake_socket))
    except SystemExit:
        # uvicorn exits (code 3, which would read as vero's "denied") when the lifespan startup
        # fails, whose cause is kept on the app, and when the port cannot be bound (it logs why).
        pass
    error = app.state.startup_error
    if isinstance(error, OSError):
        raise InfrastructureFailure(
            f"the sidecar could not start: {error.strerror or type(error).__name__}"
            + (f" ({error.filename})" if error.filename else "")
        ) from None
    if error is not None:
        raise error
    if not server.started:
        raise InfrastructureFailure(f"the sidecar could not listen on {host}:{port}")
