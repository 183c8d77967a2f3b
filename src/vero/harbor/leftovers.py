"""What nested runs leave behind when they are interrupted: the labels that name their owner, and
their removal (docs/architecture.md, "Interruptions").

Every nested run's environments carry two labels (Docker labels; Modal sandbox tags):

```
vero.session = <session>        the sidecar's session (`ses-<16 hex>`, kept in its state store), or
                                one `vero verify` invocation (`verify-<16 hex>`)
vero.job     = <evaluation id>  the evaluation (every round of it)
```

How they get there (`compose_labels`, merged by `vero.harbor.command`):

- Docker: Harbor 0.26 merges `--extra-docker-compose` files after a case's own compose file into
  every trial's agent environment (`environments/docker/docker.py` `_docker_compose_paths`). vero's
  file labels service `main`, the `default` network, the services every selected case declares
  (a file shared by all cases cannot name a service some case lacks: Compose refuses a service
  without an image) and every network and volume any selected case declares (Compose creates only
  those a service uses). A case's own further services, and a separate verifier environment (which
  gets no extra file: `trial/trial.py` `_separate_verifier_env`), are found through their Compose
  project: Compose puts `com.docker.compose.project` on everything it creates, a project holding a
  labelled object belongs to that job, and a trial's projects share one prefix
  (`<trial>__env`, `<trial>__verifier__<key>`: `compose_project_prefix`).
- Modal: `--ek labels=...` (Harbor's `ModalOptions.labels` become sandbox tags) and a sandbox
  lifetime capped near the evaluation's wall clock (`vero.harbor.environments.modal.modal_options`),
  so a sandbox whose owner died does not run Harbor's default 24 h. A Modal trial has no networks
  or volumes of its own (a compose case runs Docker inside its sandbox and ends with it).
- Other environments get no labels; vero removes nothing there (Harbor's own teardown only).

The per-evaluation gateway networks of `vero.harbor.case_route` carry the same two labels and
`vero.gateway`; they belong to no Compose project. Their owner removes them when the evaluation
ends; a removal by session (a restarted sidecar's sweep) takes what a killed process left.

Removal is the environment's (`vero.harbor.environments`: `NestedEnvironment.sweep` and
`clean_up`): on Docker `remove_docker_leftovers` (here) (containers with their anonymous volumes, then
networks, the gateway networks after disconnecting whatever is still on them, then volumes, then
the images Compose built for those projects; twice, a moment apart, for objects the engine was
still creating when the run was killed), on Modal `terminate_modal_sandboxes`. Engine and API
errors are logged, never raised: cleanup must not turn an interruption into another failure.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "LABEL_GATEWAY",
    "LABEL_JOB",
    "LABEL_SESSION",
    "SESSION_ID",
    "compose_labels",
    "compose_project_prefix",
    "new_session_id",
    "read_case_compose",
    "remove_docker_leftovers",
    "remove_network",
]

logger = logging.getLogger(__name__)

LABEL_SESSION = "vero.session"
LABEL_JOB = "vero.job"
LABEL_GATEWAY = "vero.gateway"
"""On the per-evaluation gateway networks of `vero.harbor.case_route` (value `1`)."""
_PROJECT_LABEL = "com.docker.compose.project"

SESSION_ID = re.compile(r"^(ses|verify)-[0-9a-f]{16}$")
"""What `new_session_id` makes (removal by session refuses anything else)."""


def new_session_id(kind: str = "ses") -> str:
    """A fresh session label: `ses-<16 hex>` (a sidecar's state) or `verify-<16 hex>` (a verifier run)."""
    if kind not in ("ses", "verify"):
        raise ValueError("kind must be 'ses' or 'verify'")
    return f"{kind}-{secrets.token_hex(8)}"


def compose_project_prefix(trial_name: str) -> str:
    """The Compose project-name prefix of a trial's environments.

    Harbor 0.26 names a trial's environment project `<trial_name>__env` and a separate verifier's
    `<trial_name>__verifier__<key>`, lowercased, a leading non-alphanumeric prefixed with `0`, and
    every character outside `[a-z0-9_-]` replaced by `-`
    (`environments/docker/docker.py` `_sanitize_docker_compose_project_name`).
    """
    name = (trial_name + "__").lower()
    if not re.match(r"^[a-z0-9]", name):
        name = "0" + name
    return re.sub(r"[^a-z0-9_-]", "-", name)


def read_case_compose(cases_dir: Path, case: str) -> dict[str, Any]:
    """A case's `environment/docker-compose.yaml` as a mapping (empty when absent or unreadable)."""
    import yaml

    path = cases_dir / case / "environment" / "docker-compose.yaml"
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return document if isinstance(document, dict) else {}


def _declared(document: Mapping[str, Any], section: str) -> dict[str, Any]:
    value = document.get(section)
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _labellable(definition: object) -> bool:
    # An external network or volume is not Compose's to label (and never removed by vero).
    return not (isinstance(definition, dict) and definition.get("external"))


def compose_labels(session: str | None, job: str, cases_dir: Path, case_names: Sequence[str]) -> dict[str, Any]:
    """The compose document that labels one round's environments (see the module docstring).

    Args:
        session: the `vero.session` label (None: only `vero.job`).
        job: the evaluation id (`vero.job`).
        cases_dir, case_names: the round's cases; their `environment/docker-compose.yaml` (if any)
            say which services, networks and volumes exist.

    Returns:
        `{"services": ..., "networks": ..., "volumes": ...}` (empty sections left out).
    """
    labels = {LABEL_JOB: job} | ({LABEL_SESSION: session} if session else {})
    documents = [read_case_compose(cases_dir, case) for case in case_names]
    services = set.intersection(*(set(_declared(d, "services")) for d in documents)) if documents else set()
    declared: dict[str, set[str]] = {"networks": {"default"}, "volumes": set()}
    external: dict[str, set[str]] = {"networks": set(), "volumes": set()}
    for case_document in documents:
        for section in ("networks", "volumes"):
            for name, definition in _declared(case_document, section).items():
                (declared if _labellable(definition) else external)[section].add(name)
    networks = {name: {"labels": labels} for name in sorted(declared["networks"] - external["networks"])}
    volumes = {name: {"labels": labels} for name in sorted(declared["volumes"] - external["volumes"])}
    document: dict[str, Any] = {"services": {name: {"labels": labels} for name in sorted(services | {"main"})}}
    if networks:
        document["networks"] = networks
    if volumes:
        document["volumes"] = volumes
    return document


# -- Docker: removal by label and project (`vero.harbor.environments.docker`) ------------------------


def _owner_matches(labels: Mapping[str, str], session: str | None, jobs: frozenset[str] | None) -> bool:
    if session is not None and labels.get(LABEL_SESSION) != session:
        return False
    return jobs is None or labels.get(LABEL_JOB) in jobs


def _remove_sync(
    env: Mapping[str, str], session: str | None, jobs: frozenset[str] | None, prefixes: frozenset[str], timeout_sec: int
) -> int:
    import docker
    from docker.errors import APIError, NotFound

    def remove(kind: str, name: str, call: Callable[[], object], level: int = logging.WARNING) -> int:
        try:
            call()
            return 1
        except NotFound:
            return 0
        except APIError as exc:
            logger.log(level, "could not remove %s %s: %s", kind, name, type(exc).__name__)
            return 0

    try:
        client = docker.from_env(environment=dict(env), timeout=timeout_sec)
    except Exception as exc:  # noqa: BLE001 - DockerException, or a transport error probing the engine
        logger.warning("docker cleanup skipped: engine unreachable (%s)", type(exc).__name__)
        return 0
    removed = 0
    try:
        # 1. The projects that are ours: named after a trial dir, or holding an object with our labels
        #    (a trial's projects share the prefix of its `__env` project).
        by_label = session is not None or jobs is not None
        projects: set[str] = set()
        if by_label:
            owner = {"label": LABEL_JOB if session is None else f"{LABEL_SESSION}={session}"}
            for labels in (
                *(c.labels for c in client.containers.list(all=True, filters=owner, ignore_removed=True)),
                *(n.attrs.get("Labels") or {} for n in client.networks.list(filters=owner)),
                *(v.attrs.get("Labels") or {} for v in client.volumes.list(filters=owner)),
            ):
                project = labels.get(_PROJECT_LABEL)
                if project and _owner_matches(labels, session, jobs):
                    projects.add(project.removesuffix("env") if project.endswith("__env") else project)
        starts = tuple(sorted(prefixes | projects))

        def ours(labels: Mapping[str, str] | None) -> bool:
            labels = labels or {}
            if by_label and LABEL_JOB in labels and _owner_matches(labels, session, jobs):
                return True
            project = labels.get(_PROJECT_LABEL, "")
            return bool(project) and bool(starts) and project.startswith(starts)

        any_label = {"label": _PROJECT_LABEL}
        # 2. Containers first: a network or volume still in use cannot be removed.
        for container in client.containers.list(all=True, filters=any_label, ignore_removed=True):
            if ours(container.labels):
                removed += remove(
                    "container", container.short_id, functools.partial(container.remove, force=True, v=True)
                )
        for network in client.networks.list(filters=any_label):
            if ours(network.attrs.get("Labels")):
                removed += remove("network", network.short_id, network.remove)
        if session is not None and jobs is None:
            # A gateway network lives as long as its evaluation (its owner closes it, also between
            # the retry rounds this removal may follow): only a whole session's sweep takes it.
            for network in client.networks.list(filters={"label": f"{LABEL_SESSION}={session}"}):
                if (network.attrs.get("Labels") or {}).get(LABEL_GATEWAY):
                    removed += remove_network(network)
        for volume in client.volumes.list(filters=any_label):
            if ours(volume.attrs.get("Labels")):
                removed += remove("volume", volume.short_id, functools.partial(volume.remove, force=True))
        # 3. Images Compose built for these projects are tagged `<project>-<service>` (Harbor's own
        #    teardown removes them with `down --rmi local`).
        #    One listing call: the SDK's `images.list()` inspects every image after listing, and an
        #    image another job removes in between made the whole cleanup fail (404).
        if starts:
            for image in client.api.images():
                for tag in image.get("RepoTags") or ():
                    if tag.split(":", 1)[0].startswith(starts):
                        removed += remove(
                            "image",
                            tag,
                            functools.partial(client.images.remove, tag, noprune=False),
                            level=logging.DEBUG,
                        )
    except Exception as exc:  # noqa: BLE001 - engine gone mid-way (requests errors too): logged, never raised
        logger.warning("docker cleanup incomplete: %s", type(exc).__name__)
    finally:
        client.close()
    return removed


def remove_network(network: Any) -> int:
    """Disconnect every endpoint of a Docker network (this process's container included), then
    remove it. Returns 1 when it was removed; errors are logged, never raised."""
    from docker.errors import APIError, NotFound

    try:
        network.reload()
        for container_id in network.attrs.get("Containers") or {}:
            try:
                network.disconnect(container_id, force=True)
            except NotFound:
                pass
        network.remove()
        return 1
    except NotFound:
        return 0
    except APIError as exc:
        logger.warning("could not remove network %s: %s", network.short_id, type(exc).__name__)
        return 0


def _trial_prefixes(job_dirs: Iterable[Path]) -> frozenset[str]:
    prefixes: set[str] = set()
    for job_dir in job_dirs:
        try:
            prefixes.update(compose_project_prefix(p.name) for p in job_dir.iterdir() if p.is_dir())
        except OSError:
            continue
    return frozenset(prefixes)


async def remove_docker_leftovers(
    env: Mapping[str, str],
    *,
    session: str | None = None,
    jobs: Iterable[str] | None = None,
    job_dirs: Iterable[Path] = (),
    settle_sec: float | None = 1.0,
    timeout_sec: int = 60,
) -> int:
    """Remove the Docker objects of interrupted nested runs: containers (with their anonymous
    volumes), networks, volumes and the images Compose built for them.

    An object is removed when it carries `vero.session == session` (if given) and `vero.job` in
    `jobs` (if given), or belongs to the Compose project of such an object or of a trial of
    `job_dirs` (their sub-directories are trial names). At least one of `session`, `jobs` and
    `job_dirs` must narrow the selection. Runs twice, `settle_sec` apart, to catch a container the
    engine was still creating when the run was killed (once with `settle_sec=None`: nothing of the
    selection can be running). Engine errors are logged, never raised.

    Args:
        env: environment of the Docker client (`DOCKER_HOST` and friends).
        session: only objects of this session.
        jobs: only objects of these evaluations.
        job_dirs: Harbor job dirs of the interrupted runs.
        settle_sec: pause between the two passes; None for one pass.
        timeout_sec: limit of each Docker API call.

    Returns:
        How many Docker objects were removed.

    Raises:
        ValueError: nothing narrows the selection (it would remove every vero-labelled object).
    """
    job_set = frozenset(jobs) if jobs is not None else None
    prefixes = await asyncio.to_thread(_trial_prefixes, list(job_dirs))
    if session is None and job_set is None and not prefixes:
        raise ValueError("remove_docker_leftovers needs a session, jobs or job dirs")
    if job_set is not None and not job_set and not prefixes:
        return 0
    if session is not None and not SESSION_ID.match(session):
        raise ValueError("session must be a vero session id")
    removed = await asyncio.to_thread(_remove_sync, env, session, job_set, prefixes, timeout_sec)
    if settle_sec is not None:
        await asyncio.sleep(settle_sec)
        removed += await asyncio.to_thread(_remove_sync, env, session, job_set, prefixes, timeout_sec)
    return removed
