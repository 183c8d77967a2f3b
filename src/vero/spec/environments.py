"""The Harbor environments vero runs on, and what each one needs from a spec.

vero supports two of Harbor 0.26's environments (`harbor/environments/factory.py` knows some
thirty): `docker` and `modal`. For each, this module says what differs for it, as data the spec's
validation, the compiler and the nested runs read (no Harbor import here):

- `extra`: the Harbor extra `harbor.requirement` must name (`harbor[modal]==X`);
- `credentials`: variables the nested runs cannot work without, passed by name to the trusted
  services only (compose `${NAME}` to `eval-sidecar`, `[verifier.env]`), blanked in `main`;
- `settings`: variables of the environment's client passed the same way when set (and left out when
  not): Modal's `MODAL_ENVIRONMENT` (which Modal environment of the workspace) and `MODAL_SERVER_URL`
  (which Modal API server), so nested runs reach the Modal the outer run reached;
- `managed_options`: `--ek` options vero sets on every nested run itself (a spec may not), and why;
- `refused_options`: `--ek` options that cannot work for nested runs, and why;
- `engine_socket`: nested runs need the host's Docker socket (so the outer trial must run on Docker);
- `compose`: each trial is a Docker Compose project on an engine vero's process reaches: vero's extra
  compose files apply (labels, `init`) and case containers can join a network of the sidecar's
  (`inference.route_case_services`).

What vero does on each kind lives in one module per kind, `vero.harbor.environments`.

Any other environment (`daytona`, `e2b`, a `module:Class`, ...) is refused at build: vero knows
neither its credentials nor how to find what an interrupted run left (`SUPPORTED`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "ENVIRONMENTS",
    "HARBOR_SERIES",
    "SUPPORTED",
    "EnvironmentKind",
    "drop_empty_settings",
    "environment_kind",
    "uses_compose",
]

HARBOR_SERIES = "0.26"
"""The Harbor release series whose formats vero's code reads (its CLI flags, `result.json`, task
and compose layouts; pyproject pins `harbor==0.26.0`). `harbor.requirement` must pin a version of
this series: the nested runs' Harbor writes what vero parses."""


@dataclass(frozen=True)
class EnvironmentKind:
    """What vero knows about one Harbor environment (see the module docstring)."""

    name: str
    extra: str | None = None
    credentials: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    managed_options: Mapping[str, str] = field(default_factory=dict)
    refused_options: Mapping[str, str] = field(default_factory=dict)
    engine_socket: bool = False
    compose: bool = False


ENVIRONMENTS: Mapping[str, EnvironmentKind] = MappingProxyType(
    {
        "docker": EnvironmentKind(
            name="docker",
            engine_socket=True,
            compose=True,
            refused_options={
                # The nested `harbor` runs in the sidecar's or verifier's container, against the
                # host's engine: bind-mount sources would be that container's paths, not the host's.
                "auto_mounting": "bind mounts would name paths of the sidecar's container, not of the Docker host",
            },
        ),
        "modal": EnvironmentKind(
            name="modal",
            extra="modal",
            credentials=("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"),
            settings=("MODAL_ENVIRONMENT", "MODAL_SERVER_URL"),
            managed_options={
                "labels": "vero tags every sandbox with its session and job, to find what an interrupted run left",
                "sandbox_timeout_secs": "vero caps every sandbox's lifetime at the evaluation's wall clock + 300 s",
            },
        ),
    }
)
"""Every environment vero supports, by Harbor's name."""

SUPPORTED: tuple[str, ...] = tuple(sorted(ENVIRONMENTS))


def environment_kind(name: str) -> EnvironmentKind | None:
    """The kind of `harbor.environment` `name`, or None when vero does not support it."""
    return ENVIRONMENTS.get(name)


def uses_compose(name: str) -> bool:
    """Whether trials on environment `name` are Compose projects on an engine vero reaches
    (`EnvironmentKind.compose`); False for an environment vero does not support."""
    kind = ENVIRONMENTS.get(name)
    return kind is not None and kind.compose


def drop_empty_settings(names: Iterable[str], environ: MutableMapping[str, str]) -> list[str]:
    """Remove the settings `names` that are set but empty from `environ` (in place); return them.

    The compiled task passes a setting the host left unset as an empty string (compose `${NAME:-}`,
    `[verifier.env]` `${NAME:-}`), and an empty `MODAL_SERVER_URL` would replace the Modal client's
    default server. The sidecar and the verifier call this at start, before any SDK reads them.
    """
    dropped = [name for name in names if name in environ and not environ[name]]
    for name in dropped:
        del environ[name]
    return dropped
