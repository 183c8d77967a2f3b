"""The candidate hosts' network fence: the kernel lets a candidate host reach its gateway and nothing else.

A candidate host (`vero.harbor.boundary.launcher`) runs as a throw-away uid in the sidecar's (or the
verifier's) network namespace. Without a fence its sockets are the container's: it could connect
to a listener in `main` over the compose network, to the container's other listeners on loopback,
to the verifier or any outside address, resolve names through Docker's DNS, or listen for `main`
(docs/trust-model.md). The fence is one nftables table (`FENCE_TABLE`, family `inet`: IPv4 and
IPv6), installed by the trusted root process before its first `kind: agent` evaluation:

- **output**, packets whose socket belongs to a uid of `CANDIDATE_UID_RANGE` (`meta skuid`; a uid
  cannot create a socket as another, and it has no capability to send raw packets): only TCP in
  the connection's original direction to an address and port of the `gateways` set passes, i.e.
  the inference gateway's listeners of the evaluations running now (the loopback gateway and each
  evaluation's case route listener, taken from the URLs the hosts are given); any other TCP is
  refused with a reset (the candidate's connect fails at once), everything else (UDP and so DNS,
  ICMP, every IPv6 packet) is dropped (its send fails with EPERM). A SYN-ACK a candidate's listener
  would answer is in the reply direction and is dropped too.
- **input**, packets arriving from other hosts (not loopback): only replies to connections this
  container opened, TCP to the gateway listeners and to the process's own service listeners
  (`service`: the sidecar's API), and ICMP pass; every other packet is dropped. So a port where a
  candidate listens (TCP or UDP) looks from `main` exactly like a port where nobody does: the
  candidate can neither be reached nor signal by which ports it holds. (Without this, a SYN to a
  candidate's port goes unanswered while a closed port answers a reset, and under SYN cookies the
  kernel's SYN-ACK carries no socket for the output rule to match.)

The fence needs `CAP_NET_ADMIN` (the compiled compose files add it for `kind: agent` targets) and
the `nft` tool (nftables, installed in the sidecar and verifier images). When it cannot be
installed, `NetworkFence.install` raises `FenceUnavailable`, an infrastructure failure naming
the cause: no candidate host runs unconfined (`vero.harbor.runner.HarborBackend`).

Not covered: what is not IP (a candidate's Unix sockets reach only what file permissions let its
uid reach; abstract Unix sockets are shared by every process of the namespace), and the network of
the case containers a candidate drives through its environment (the case's own network mode).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from vero.errors import InfrastructureFailure
from vero.harbor.boundary.launcher import CANDIDATE_UID_RANGE

__all__ = [
    "FENCE_TABLE",
    "Endpoint",
    "FenceUnavailable",
    "NetworkFence",
    "ServiceListener",
    "element_commands",
    "endpoints_of",
    "fence_ruleset",
]

logger = logging.getLogger("vero.harbor.boundary")

FENCE_TABLE = "vero_candidate_fence"
"""The nftables table (family `inet`) of the fence; replaced whole when installed."""
_NFT_TIMEOUT_SEC = 30.0
_GATEWAY_VARIABLE_SUFFIX = "_BASE_URL"


class FenceUnavailable(InfrastructureFailure):
    """The fence could not be installed or changed: a `kind: agent` evaluation does not run (refunded)."""


@dataclass(frozen=True, order=True)
class Endpoint:
    """A TCP listener a candidate host may connect to: an IPv4 address and a port."""

    address: str
    port: int

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(self.address)  # ValueError for anything else (an IPv6 or a name)
        if not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")

    def element(self) -> str:
        """The endpoint as an element of an `ipv4_addr . inet_service` set."""
        return f"{self.address} . {self.port}"


@dataclass(frozen=True, order=True)
class ServiceListener:
    """A listener of the trusted process that other hosts may connect to (TCP): on `address` only,
    or on every address (`address` None, a wildcard bind: then no other socket can hold the port)."""

    port: int
    address: str | None = None

    def __post_init__(self) -> None:
        if self.address is not None:
            Endpoint(self.address, self.port)
        elif not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")


def endpoints_of(candidate_env: Mapping[str, str]) -> frozenset[Endpoint]:
    """The gateway listeners named by a candidate host's variables: the host and port of every
    `*_BASE_URL` value (`vero.inference.gateway.gateway_environment`, the case route's variables).

    Raises:
        FenceUnavailable: a URL's host is not an IPv4 address (the fence admits addresses, never
            names: a candidate host gets no DNS).
    """
    found: set[Endpoint] = set()
    for name, value in candidate_env.items():
        if not name.endswith(_GATEWAY_VARIABLE_SUFFIX):
            continue
        parts = urlsplit(value)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            found.add(Endpoint(parts.hostname or "", port))
        except ValueError as exc:
            raise FenceUnavailable(
                f"the candidate hosts' network fence admits IPv4 gateway addresses only; {name} is {value!r}"
            ) from exc
    return frozenset(found)


def _set(name: str, kind: str, elements: Iterable[str]) -> list[str]:
    listed = sorted(set(elements))
    lines = [f"\tset {name} {{", f"\t\ttype {kind}"]
    if listed:
        lines.append("\t\telements = { " + ", ".join(listed) + " }")
    return [*lines, "\t}"]


def fence_ruleset(uids: range, service: Iterable[ServiceListener] = ()) -> str:
    """The fence's table for `nft -f` (see the module docstring): the table is created, deleted and
    created again in one transaction, so installing it replaces an earlier one atomically and the
    `gateways` set starts empty.

    Args:
        uids: the candidate hosts' uids (a contiguous range, step 1).
        service: the process's own listeners that other hosts may reach.

    Raises:
        ValueError: `uids` is empty or not contiguous.
    """
    if len(uids) == 0 or uids.step != 1:
        raise ValueError("the candidate uids must be a non-empty contiguous range")
    listeners = list(service)
    lines = [
        f"table inet {FENCE_TABLE}",
        f"delete table inet {FENCE_TABLE}",
        f"table inet {FENCE_TABLE} {{",
        *_set("gateways", "ipv4_addr . inet_service", ()),
        *_set("service_ports", "inet_service", (str(s.port) for s in listeners if s.address is None)),
        *_set(
            "service_endpoints",
            "ipv4_addr . inet_service",
            (Endpoint(s.address, s.port).element() for s in listeners if s.address is not None),
        ),
        "\tchain output {",
        "\t\ttype filter hook output priority filter; policy accept;",
        f"\t\tmeta skuid {uids.start}-{uids.stop - 1} jump candidate",
        "\t}",
        "\tchain candidate {",
        "\t\tct direction original meta l4proto tcp ip daddr . tcp dport @gateways accept",
        "\t\tmeta l4proto tcp counter reject with tcp reset",
        "\t\tcounter drop",
        "\t}",
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        '\t\tiif "lo" accept',
        "\t\tct state established,related accept",
        "\t\tmeta l4proto tcp ip daddr . tcp dport @gateways accept",
        "\t\tmeta l4proto tcp ip daddr . tcp dport @service_endpoints accept",
        "\t\tmeta l4proto tcp tcp dport @service_ports accept",
        "\t\tmeta l4proto { icmp, ipv6-icmp } accept",
        "\t\tcounter drop",
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"


def element_commands(verb: str, endpoints: Iterable[Endpoint]) -> str:
    """`nft -f` input adding (`verb` "add") or deleting ("delete") `endpoints` in the `gateways`
    set; "" when there are none.

    Raises:
        ValueError: `verb` is neither.
    """
    if verb not in ("add", "delete"):
        raise ValueError(f"verb must be add or delete, not {verb!r}")
    listed = sorted(set(endpoints))
    if not listed:
        return ""
    elements = ", ".join(e.element() for e in listed)
    return f"{verb} element inet {FENCE_TABLE} gateways {{ {elements} }}\n"


class NetworkFence:
    """The fence of this process's network namespace (see the module docstring).

    `install` once (the first `kind: agent` evaluation does it, `HarborBackend`); each evaluation
    then holds its gateway endpoints open with `async with fence.admitting(endpoints):` while its
    candidate hosts run. Endpoints are counted: one shared by evaluations running at once (the
    loopback gateway) stays until the last of them leaves.

    Args:
        service: the process's listeners other hosts may reach (the sidecar's API); none for the
            verifier.
        uids: the candidate hosts' uids (`CANDIDATE_UID_RANGE`).
        nft: the nftables command (found on PATH by default).
    """

    def __init__(self, *, service: Iterable[ServiceListener] = (), uids: range | None = None, nft: str = "nft") -> None:
        self.service = tuple(service)
        self.uids = CANDIDATE_UID_RANGE if uids is None else uids
        self.nft = nft
        self.installed = False
        self._lock = asyncio.Lock()
        self._admitted: Counter[Endpoint] = Counter()

    async def _apply(self, script: str, what: str) -> None:
        command = shutil.which(self.nft) or self.nft
        try:
            process = await asyncio.create_subprocess_exec(
                command,
                "-f",
                "-",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, stderr = await asyncio.wait_for(process.communicate(script.encode()), timeout=_NFT_TIMEOUT_SEC)
        except FileNotFoundError:
            raise FenceUnavailable(
                f"the candidate hosts' network fence could not be {what}: {self.nft!r} is not installed "
                "(nftables); kind: agent evaluations do not run unconfined"
            ) from None
        except (OSError, TimeoutError) as exc:
            raise FenceUnavailable(
                f"the candidate hosts' network fence could not be {what}: {type(exc).__name__}"
            ) from None
        if process.returncode != 0:
            detail = " ".join(stderr.decode(errors="replace").split())[-300:]
            hint = " (the container needs CAP_NET_ADMIN)" if "not permitted" in detail else ""
            raise FenceUnavailable(
                f"the candidate hosts' network fence could not be {what}: nft exited {process.returncode}: "
                f"{detail}{hint}; kind: agent evaluations do not run unconfined"
            )

    async def install(self) -> None:
        """Install (or replace) the fence; a no-op once installed by this object.

        Raises:
            FenceUnavailable: `nft` is missing, not permitted (no CAP_NET_ADMIN) or refused the table.
        """
        async with self._lock:
            if self.installed:
                return
            await self._apply(fence_ruleset(self.uids, self.service), "installed")
            self._admitted.clear()
            self.installed = True
            logger.info(
                "candidate hosts' network fence installed (uids %d-%d: their gateway only)",
                self.uids.start,
                self.uids.stop - 1,
            )

    @asynccontextmanager
    async def admitting(self, endpoints: Iterable[Endpoint]) -> AsyncIterator[None]:
        """Install the fence if needed and let candidate hosts reach `endpoints` until the block ends.

        Raises:
            FenceUnavailable: the fence cannot be installed or the endpoints cannot be added (nothing
                of the block runs).
        """
        wanted = sorted(set(endpoints))
        await self.install()
        async with self._lock:
            new = [e for e in wanted if self._admitted[e] == 0]
            if new:
                await self._apply(element_commands("add", new), "opened to the evaluation's gateway")
            self._admitted.update(wanted)
        try:
            yield
        finally:
            await asyncio.shield(self._release(wanted))

    async def _release(self, endpoints: list[Endpoint]) -> None:
        async with self._lock:
            self._admitted.subtract(endpoints)
            gone = [e for e in endpoints if self._admitted[e] <= 0]
            for endpoint in gone:
                del self._admitted[endpoint]
            if gone:
                try:
                    await self._apply(element_commands("delete", gone), "closed after the evaluation")
                except FenceUnavailable as exc:  # a stale gateway endpoint admits only the gateway
                    logger.warning("%s", exc)
