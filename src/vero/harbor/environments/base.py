"""`NestedEnvironment`: what differs, for vero's nested runs, from one Harbor environment to another.

Harbor 0.26 puts each environment behind `harbor/environments/base.py` and one module per provider,
chosen by `factory.py`; vero does the same for what it must know of them beyond Harbor's own
interface: whether a run is a Compose project on an engine this process reaches (extra compose
files: labels, `init`, the case networks of `vero.harbor.case_route`), the `--ek` options vero sets
itself, how to find and remove what an interrupted run left, whether the engine still answers, and
what must be in place before a run starts (credentials, the engine). One module per kind
(`docker`, `modal`); callers never compare environment names. This base is what vero does for an
environment it has no module for: nothing to label, nothing it can find to remove, nothing to check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vero.spec.environments import uses_compose

if TYPE_CHECKING:
    from vero.core.run import NestedRun
    from vero.spec.models import HarborSpec

__all__ = ["NestedEnvironment"]


class NestedEnvironment:
    """One Harbor environment as vero's nested runs use it (see the module docstring).

    Args:
        name: the environment's Harbor name (`harbor.environment`).
    """

    leftovers_noun = "object(s)"
    """What `clean_up` counts, for the log."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def compose(self) -> bool:
        """Whether each trial is a Docker Compose project on an engine this process reaches: Harbor
        merges vero's extra compose files (labels, `init`) and the case routes' networks can attach
        (`vero.spec.environments.EnvironmentKind.compose`)."""
        return uses_compose(self.name)

    def preflight(self, env: Mapping[str, str]) -> None:
        """Fail fast, before anything is built, when runs on this environment cannot work with
        `env` (`vero harbor run`).

        Raises:
            InfrastructureFailure: with what is missing and how to fix it.
        """

    def run_options(self, harbor: HarborSpec, session: str | None, job: str) -> dict[str, Any]:
        """The `--ek` options of one nested run: the spec's `harbor.environment_options`, then what
        vero sets itself on this environment (the build refuses a spec that sets those,
        `vero.spec.environments`)."""
        return dict(harbor.environment_options)

    async def sweep(
        self,
        env: Mapping[str, str],
        *,
        session: str,
        jobs: Sequence[str] | None,
        options: Mapping[str, object],
    ) -> int:
        """Remove what interrupted runs of `session` (of `jobs` only, if given) left, when none of
        them can still be running (a sidecar's start). `env`: the client's environment; `options`:
        the runs' `harbor.environment_options`. Errors are logged, never raised. Returns how many
        objects were removed."""
        return 0

    async def clean_up(
        self, run: NestedRun, env: Mapping[str, str], session: str | None, job_dir: Path, quick: bool
    ) -> int:
        """Remove what one run (`run`, labelled with `session`, its Harbor job in `job_dir`) left,
        right after it; `quick`: the process is stopping (one short pass). Errors are logged,
        never raised. Returns how many objects were removed."""
        return 0

    async def engine_reachable(self, env: Mapping[str, str]) -> bool | None:
        """Whether the runs' engine answers now: True, False, or None where vero cannot tell. Tells
        an engine failure from a candidate's after a trial's files could not be collected."""
        return None
