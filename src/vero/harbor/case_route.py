"""Routing the case containers' own model-backed services (a user simulator, a grader) to the
inference gateway on Docker: `inference.route_case_services` (docs/inference.md).

The gateway listens on the loopback of the sidecar's (or the verifier's) process; nested case
containers run on the host's Docker engine in Compose projects of their own and cannot reach it.
Per evaluation, `CaseRouter.open`:

1. creates an `internal` bridge network `vero-gw-<evaluation>-<hex>` (no route out of it), labelled
   `vero.session`, `vero.job` and `vero.gateway` (`vero.harbor.leftovers` removes it after a crash);
2. puts this process on it: in a container (`own_container`: the id Docker's bind mounts show in
   `/proc/self/mountinfo`), that container is connected to it; on a host, the network's bridge
   address is the host's own;
3. serves the gateway on that address only, on a fresh port, for this evaluation's token only, to
   callers from that network's subnet (and this evaluation's own candidate hosts)
   (`vero.inference.gateway.GatewayServer` with `evaluation_id` and `remote_network`);
4. names the network for the nested run (`NestedRun.case_network`): each round's compose override
   attaches `main` and the services every selected case declares (`case_route_compose`).

What a case container on that network can reach of this process: the gateway's model endpoints,
with this evaluation's token. The sidecar's API does not listen there (`service_addresses`: with
the switch, `vero harbor serve` binds loopback and its container's other networks only), and the
containers of other evaluations are on other networks. Whatever a case's service can reach, the
candidate code in that case may reach too: the token is the evaluation's own, metered against its
budget and revoked when it ends. `close` stops the listener, disconnects every endpoint and
removes the network.

Not routed: cases whose network is not `public` (Harbor's egress control puts every service
without networks of its own into its sidecar's namespace; attaching one would take it out of it),
services with a `network_mode`, services only some of the round's cases declare (a shared override
cannot name a service a case lacks), and a separate verifier environment (Harbor gives it no extra
compose file). Their calls fail; none is ever sent with a provider key.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import ipaddress
import logging
import re
import secrets
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vero.core.offloop import finish_uncancellable
from vero.errors import InfrastructureFailure
from vero.harbor.leftovers import LABEL_GATEWAY, LABEL_JOB, LABEL_SESSION, read_case_compose
from vero.spec.environments import uses_compose

if TYPE_CHECKING:
    from vero.inference.gateway import GatewayServer, InferenceGateway
    from vero.spec.models import InferenceSpec

__all__ = [
    "CASE_ROUTE_VARIABLES",
    "GATEWAY_NETWORK_KEY",
    "GATEWAY_NETWORK_PREFIX",
    "CaseRoute",
    "CaseRouter",
    "case_route_compose",
    "case_router_for",
    "network_gateway_address",
    "own_container_id",
    "service_addresses",
]

logger = logging.getLogger(__name__)

GATEWAY_NETWORK_PREFIX = "vero-gw-"
"""Name prefix of the per-evaluation gateway networks."""
GATEWAY_NETWORK_KEY = "vero-gateway"
"""The network's key in the compose override (`networks.vero-gateway`, `external`)."""
CASE_ROUTE_VARIABLES = ("VERO_INFERENCE_CASE_OPENAI_BASE_URL", "VERO_INFERENCE_CASE_ANTHROPIC_BASE_URL")
"""Variables a candidate host also gets with the switch: the gateway as the case containers reach
it (for a candidate agent that runs a model-calling program inside the case's `main`)."""

_DOCKER_TIMEOUT_SEC = 60
_BRIDGE_WAIT_SEC = 10.0
_HOST_ATTEMPTS = 3
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
_CONTAINER_ID = re.compile(r"/containers/([0-9a-f]{64})/(hostname|hosts|resolv\.conf) /etc/\2 ")
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")


def own_container_id(mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """The id of the Docker container this process runs in, or None (not in one, or unreadable).

    Docker bind-mounts `/etc/hostname`, `/etc/hosts` and `/etc/resolv.conf` from
    `<data-root>/containers/<id>/`, and `/proc/self/mountinfo` names that source. Only a mount AT
    `/etc/<that name>` counts: another container's mount of it, seen elsewhere in this namespace
    (propagated under its root file system), is not this process's (taken for it, the host's
    process joined that container to the case network and took its address, which it cannot
    bind). (A container of another engine shows an id this engine does not know: `own_container`
    then finds nothing.)
    """
    try:
        text = mountinfo.read_text()
    except OSError:
        return None
    found = _CONTAINER_ID.search(text)
    return found.group(1) if found else None


def _own_container(client: Any) -> Any | None:
    from docker.errors import NotFound

    container_id = own_container_id()
    if container_id is None:
        return None
    try:
        return client.containers.get(container_id)
    except NotFound:
        return None


def _client(env: Mapping[str, str]) -> Any:
    import docker

    return docker.from_env(environment=dict(env), timeout=_DOCKER_TIMEOUT_SEC)


def service_addresses(env: Mapping[str, str]) -> list[str] | None:
    """The IPv4 addresses this process's container has on its networks other than gateway networks
    (what `vero harbor serve` binds besides loopback when case services are routed), or None when
    this process is not in a container of this engine.

    Raises:
        InfrastructureFailure: the engine cannot be asked (the sidecar must not listen on every
            interface while case networks may be attached to it).
    """
    try:
        client = _client(env)
    except Exception as exc:  # noqa: BLE001 - DockerException or a transport error
        raise InfrastructureFailure(
            f"route_case_services: the Docker engine is unreachable ({type(exc).__name__})"
        ) from None
    try:
        container = _own_container(client)
        if container is None:
            return None
        networks = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
        return sorted(
            {
                settings["IPAddress"]
                for name, settings in networks.items()
                if not name.startswith(GATEWAY_NETWORK_PREFIX) and settings and settings.get("IPAddress")
            }
        )
    finally:
        client.close()


def _network_name(evaluation_id: str) -> str:
    slug = _NAME_UNSAFE.sub("-", evaluation_id).strip("-.")[:48] or "evaluation"
    return f"{GATEWAY_NETWORK_PREFIX}{slug}-{secrets.token_hex(4)}"


@dataclass
class CaseRoute:
    """One evaluation's route: its network and the gateway's address on it.

    Attributes:
        network: the Docker network's name (`NestedRun.case_network`).
        base_url: `http://<address>:<port>` of the evaluation's listener.
    """

    network: str
    base_url: str
    _router: CaseRouter = field(repr=False)
    _server: GatewayServer = field(repr=False)
    _closed: bool = field(default=False, repr=False)

    def environment(self, token: str) -> dict[str, str]:
        """The gateway's variables (`gateway_environment`) as the case containers reach it: for the
        nested `harbor` process, whose environment the cases' `${VAR}` templates read."""
        from vero.inference.gateway import gateway_environment

        return gateway_environment(self.base_url, token)

    def candidate_variables(self) -> dict[str, str]:
        """`CASE_ROUTE_VARIABLES` with their values (for candidate hosts)."""
        openai, anthropic = CASE_ROUTE_VARIABLES
        return {openai: f"{self.base_url}/openai/v1", anthropic: f"{self.base_url}/anthropic"}

    async def close(self) -> None:
        """Stop the listener, disconnect every endpoint, remove the network (once; never raises;
        finishes even when the caller is cancelled)."""
        if self._closed:
            return
        self._closed = True
        await finish_uncancellable(self._router._close(self))


class CaseRouter:
    """Opens and closes the routes of one gateway (see the module docstring).

    Args:
        gateway: the listening gateway of this process.
        docker_env: environment of the Docker client (`DOCKER_HOST` and friends).
        session: the `vero.session` label of this process's nested runs.
    """

    def __init__(self, gateway: InferenceGateway, docker_env: Mapping[str, str], session: str | None) -> None:
        self.gateway = gateway
        self.docker_env = dict(docker_env)
        self.session = session

    async def open(self, evaluation_id: str) -> CaseRoute:
        """Create the evaluation's network, join it and serve the gateway there.

        Raises:
            InfrastructureFailure: the engine refused (or is unreachable), the network has no
                address for this process, or the listener could not bind; nothing is left behind.
        """
        from vero.inference.gateway import GatewayServer

        name = _network_name(evaluation_id)
        labels = {LABEL_GATEWAY: "1", LABEL_JOB: evaluation_id}
        if self.session:
            labels[LABEL_SESSION] = self.session
        for attempt in range(1, _HOST_ATTEMPTS + 1):
            try:
                address, subnet = await finish_uncancellable(asyncio.to_thread(self._create, name, labels))
            except asyncio.CancelledError:
                await finish_uncancellable(asyncio.to_thread(self._remove, name))
                raise
            server = GatewayServer(
                self.gateway, host=address, port=0, evaluation_id=evaluation_id, remote_network=subnet
            )
            try:
                await server.__aenter__()
            except Exception as exc:  # noqa: BLE001 - RuntimeError when it cannot bind, anything else alike
                # The address this host had on the network when it was made may be gone by the
                # time the listener binds (on the host, under a burst of network churn beside it:
                # one whole-suite run in three; cause in the engine not established): another
                # network, as `_create` makes for an address that was never there.
                gone = not await asyncio.to_thread(_bindable, address)
                await finish_uncancellable(asyncio.to_thread(self._remove, name))
                if gone and attempt < _HOST_ATTEMPTS:
                    logger.warning(
                        "case network %s: this host's address %s was gone when the gateway bound it "
                        "(attempt %d of %d); network removed, creating another",
                        name, address, attempt, _HOST_ATTEMPTS,
                    )  # fmt: skip
                    continue
                raise InfrastructureFailure(
                    f"route_case_services: the gateway could not listen on the case network ({type(exc).__name__})"
                ) from None
            except asyncio.CancelledError:
                await finish_uncancellable(self._stop(server, name))
                raise
            assert server.url is not None
            logger.info("evaluation %s: case containers reach the gateway on network %s", evaluation_id, name)
            return CaseRoute(network=name, base_url=server.url, _router=self, _server=server)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _close(self, route: CaseRoute) -> None:
        await self._stop(route._server, route.network)

    async def _stop(self, server: GatewayServer, network: str) -> None:
        try:
            await server.__aexit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - closing must go on to the network
            logger.warning("the case route's listener did not stop cleanly (%s)", type(exc).__name__)
        await asyncio.to_thread(self._remove, network)

    def _create(self, name: str, labels: dict[str, str]) -> tuple[str, ipaddress.IPv4Network]:
        """Create the network and join it; the address this process has on it and its subnet (the
        only remote callers the route's listener serves).

        A process outside any container (a sidecar run on the host) listens on the network's
        bridge. Under a burst of network creations and removals beside it, Docker 20.10 answered
        for a new network a gateway (`192.168.0.2`, `192.168.160.2`: in the subnet, not its first
        address) that no interface of the host had, so the listener could not bind (EADDRNOTAVAIL;
        two of two whole-suite runs on three workers, never one alone; the engine's cause is not
        established). Such a network is removed and another created, `_HOST_ATTEMPTS` in all.
        """
        try:
            client = _client(self.docker_env)
        except Exception as exc:  # noqa: BLE001 - DockerException or a transport error
            raise InfrastructureFailure(
                f"route_case_services: the Docker engine is unreachable ({type(exc).__name__})"
            ) from None
        try:
            for attempt in range(1, _HOST_ATTEMPTS + 1):
                joined = self._create_once(client, name, labels)
                if joined is not None:
                    return joined
                logger.warning(
                    "case network %s: the engine's address for this host is not on any interface "
                    "(attempt %d of %d); network removed%s",
                    name, attempt, _HOST_ATTEMPTS, "" if attempt == _HOST_ATTEMPTS else ", creating another",
                )  # fmt: skip
            raise InfrastructureFailure("route_case_services: the case network gave this host no usable address")
        except InfrastructureFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - docker.errors.APIError and transport errors
            raise InfrastructureFailure(
                f"route_case_services: the case network could not be set up ({type(exc).__name__})"
            ) from None
        finally:
            client.close()

    def _create_once(self, client: Any, name: str, labels: dict[str, str]) -> tuple[str, ipaddress.IPv4Network] | None:
        """One network and this process's address on it, or None (the network removed): on the
        host, no interface has the address the engine gave."""
        network = client.networks.create(name, driver="bridge", internal=True, labels=labels)
        try:
            container = _own_container(client)
            if container is not None:
                network.connect(container)
                container.reload()
                settings = container.attrs["NetworkSettings"]["Networks"].get(name) or {}
                address = settings.get("IPAddress")
            else:
                network.reload()
                address = _bridge_address(network.id) or network_gateway_address(network.attrs)
                if address and not _bindable(address):
                    logger.info(
                        "case network %s: IPAM %s, the bridge's address %s",
                        name, (network.attrs.get("IPAM") or {}).get("Config"), _bridge_address(network.id, 0.0),
                    )  # fmt: skip
                    self._remove_with(client, name)
                    return None
            if not address:
                raise InfrastructureFailure("route_case_services: the case network gave this process no address")
            network.reload()
            subnet = ((network.attrs.get("IPAM") or {}).get("Config") or [{}])[0].get("Subnet")
            try:
                return str(address), ipaddress.IPv4Network(str(subnet))
            except ValueError:
                raise InfrastructureFailure("route_case_services: the case network has no IPv4 subnet") from None
        except BaseException:
            self._remove_with(client, name)
            raise

    def _remove(self, name: str) -> None:
        try:
            client = _client(self.docker_env)
        except Exception as exc:  # noqa: BLE001 - logged: cleanup never raises
            logger.warning("case network %s not removed: engine unreachable (%s)", name, type(exc).__name__)
            return
        try:
            self._remove_with(client, name)
        finally:
            client.close()

    @staticmethod
    def _remove_with(client: Any, name: str) -> None:
        from docker.errors import NotFound

        from vero.harbor.leftovers import remove_network

        try:
            network = client.networks.get(name)
        except NotFound:
            return
        except Exception as exc:  # noqa: BLE001 - logged: cleanup never raises
            logger.warning("case network %s not removed (%s)", name, type(exc).__name__)
            return
        remove_network(network)


def _is_public(case_dir: Path) -> bool:
    """Whether every network policy of the case (environment, agent, verifier, steps) is `public`."""
    from harbor.models.task.config import TaskConfig

    try:
        config = TaskConfig.model_validate_toml((case_dir / "task.toml").read_text())
    except (OSError, ValueError):
        return False

    def modes(value: Any) -> list[Any]:
        if isinstance(value, dict):
            found = [value["network_mode"]] if "network_mode" in value else []
            return found + [m for v in value.values() for m in modes(v)]
        if isinstance(value, list):
            return [m for v in value for m in modes(v)]
        return []

    return all(mode in (None, "public") for mode in modes(config.model_dump(mode="json")))


def case_router_for(
    inference: InferenceSpec | None,
    environment: str,
    gateway: InferenceGateway,
    docker_env: Mapping[str, str],
    session: str | None,
) -> CaseRouter | None:
    """The router of each evaluation's network to `gateway` when `inference.route_case_services`
    is set and the cases run on Docker (the sidecar, the verifier and `check` alike); else None."""
    if inference is None or not inference.route_case_services or not uses_compose(environment):
        return None
    return CaseRouter(gateway, docker_env, session)


def case_route_compose(network: str, cases_dir: Path, case_names: Sequence[str]) -> dict[str, Any] | None:
    """The part of a round's compose override that attaches its case containers to `network`.

    `main` and every service all of `case_names` declare join `network` (as the external network
    `GATEWAY_NETWORK_KEY`), and `default` too when some case leaves the service on it implicitly
    (naming one network would otherwise take it off `default`). Services with a `network_mode` are
    left alone (`service:main` shares main's). Returns None when some case's network is not
    `public` (see the module docstring): then nothing is attached.
    """
    if not all(_is_public(cases_dir / case) for case in case_names):
        return None
    documents = [read_case_compose(cases_dir, case) for case in case_names]

    def services_of(document: Mapping[str, Any]) -> dict[str, Any]:
        value = document.get("services")
        return {str(k): (v if isinstance(v, dict) else {}) for k, v in value.items()} if isinstance(value, dict) else {}

    declared = [services_of(d) for d in documents]
    shared = set.intersection(*(set(d) for d in declared)) if declared else set()
    services: dict[str, Any] = {}
    for name in sorted(shared | {"main"}):
        configs = [d.get(name, {}) for d in declared]
        if any("network_mode" in c for c in configs):
            continue
        networks: dict[str, Any] = {GATEWAY_NETWORK_KEY: {}}
        if not configs or any("networks" not in c for c in configs):
            networks["default"] = {}
        services[name] = {"networks": networks}
    return {"services": services, "networks": {GATEWAY_NETWORK_KEY: {"external": True, "name": network}}}


def _bindable(address: str) -> bool:
    """Whether this process can listen on `address` (an address of one of its interfaces)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def _bridge_address(network_id: str, wait_sec: float = _BRIDGE_WAIT_SEC) -> str | None:
    """The IPv4 address the kernel gives this host on the bridge of a network this process created
    (`br-<id[:12]>`, the Docker bridge driver's name when no `bridge.name` option is set), once it
    has one (an interface without an address yet is asked again for up to `wait_sec`); None at
    once when no such interface exists (an engine on another host), or when it has no address by then.

    The kernel's address, not IPAM's: the one a listener can bind (`CaseRouter._create` says when
    the two differed).
    """
    name = f"br-{network_id[:12]}"
    deadline = time.monotonic() + wait_sec
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        while True:
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
                return socket.inet_ntoa(answer[20:24])
            except OSError as exc:
                # No such interface: the engine is elsewhere (or named its bridge otherwise).
                if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() >= deadline:
                    return None
            time.sleep(0.05)


def network_gateway_address(attrs: Mapping[str, Any]) -> str | None:
    """The host's IPv4 address on a Docker network, from its `docker network inspect` attributes.

    The IPAM config names it as `Gateway`, but engines leave that out where the gateway is the
    default one (seen on the default `bridge` of Docker 20.10 once `docker0` existed before the
    engine started): then it is the subnet's first host address, which is what the engine gives
    the bridge. None when the network has no IPv4 subnet.
    """
    for config in (attrs.get("IPAM") or {}).get("Config") or []:
        gateway = config.get("Gateway")
        try:
            if gateway and ipaddress.ip_address(gateway).version == 4:
                return str(gateway)
            subnet = ipaddress.ip_network(config.get("Subnet") or "", strict=False)
        except ValueError:
            continue
        if subnet.version == 4 and subnet.num_addresses > 2:
            return str(subnet.network_address + 1)
    return None
