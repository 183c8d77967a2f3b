"""`vero harbor verify` (the verifier's `tests/test.sh`) and `vero report` (operators).

Both are thin: parse options, call `vero.verifier`, print one JSON document on stdout, exit by
outcome. `verify` exits by the finalization's status (`VERIFIER_STATUS_EXIT_CODES`): 0 `scored`,
21 `unmeasurable`, 16 `partial`, 17 `failed`, 10 `refused`; 2 for an unreadable config.
Harbor ignores the verifier's exit code (docs/harbor-notes.md §1): the reward file is what counts, and
`verify` writes it in every case but one: a config it cannot read names no reward keys, so no file
is written and Harbor marks the reward invalid (`RewardFileNotFoundError`), which no real
measurement loses to either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vero.commands.exit_codes import EXIT_FAILED, VERIFIER_STATUS_EXIT_CODES, run_command
from vero.spec.compiled import CONTAINER_PATHS

if TYPE_CHECKING:
    from vero.harbor import HarborBackend

_P = CONTAINER_PATHS
logger = logging.getLogger("vero.verifier")

VERIFY_HELP = (
    "Verify a sealed session: check its digests, pick the candidate, score it on the hidden "
    "partitions with nested Harbor runs, write Harbor's reward.json and the operator artifacts "
    "(finalization.json, status.json, the session copy, experiment.html).\n\n"
    "The compiled task's verifier runs this (tests/test.sh), so every default is a path inside that "
    "container. Elsewhere, point --config, --cases-dir and --baseline-dir at the compiled task's "
    "tests/config.json, tests/cases and tests/baseline, and choose --session, --reward-path, "
    "--artifacts-dir and --mirror-dir.\n\n"
    "Exit codes: 0 every target measured (status scored); 21 every target has its reward but some "
    "target's verdict is unmeasurable (too much missing evidence; status unmeasurable); 16 some target "
    "got its failure value "
    "(partial); 17 no target was measured or nothing was shipped (failed); 10 the session archive "
    "was refused; 2 the config cannot be read (then no reward.json is written; in every other case "
    "it is). finalization.json's errors and problems say why."
)

REPORT_HELP = (
    "Render experiment.html from a sealed session archive: candidates, scores per partition over "
    "time, budget burn and, when a matching finalization.json is found, the final rewards.\n\n"
    "The archive is checked first (its .sha256, the manifest's file digests, the candidate bundle). "
    "Exit codes: 0 written; 10 the archive, or a finalization named with --finalization, fails its checks."
)


def verify_command(
    config: Annotated[Path, typer.Option("--config", help="The verifier's compiled config.")] = Path(_P.config),
    session: Annotated[
        Path, typer.Option("--session", help="The sealed session archive (its .sha256 beside it).")
    ] = Path(_P.session_archive),
    cases_dir: Annotated[
        Path, typer.Option("--cases-dir", help="Cases of the target and selection partitions.")
    ] = Path(_P.cases),
    baseline_dir: Annotated[Path, typer.Option("--baseline-dir", help="The baseline files.")] = Path(_P.baseline),
    reward_path: Annotated[
        Path, typer.Option("--reward-path", help="Harbor's reward file (replaced, never followed).")
    ] = Path(_P.reward),
    artifacts_dir: Annotated[
        Path, typer.Option("--artifacts-dir", help="Where the operator artifacts are written.")
    ] = Path(_P.artifacts),
    mirror_dirs: Annotated[
        list[Path] | None,
        typer.Option(
            "--mirror-dir",
            metavar="<path>",
            help="Another directory receiving the same artifacts; "
            "repeatable. "
            f"Default: {_P.artifacts_mirror} (unless it is the artifacts dir).",
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Scratch space for the extracted session, checkouts and nested "
            "Harbor jobs. Default: a new directory under the system temp dir.",
        ),
    ] = None,
    runner_user: Annotated[
        str, typer.Option("--runner-user", help="Unprivileged user nested runs execute as when verifying as root.")
    ] = "vero-runner",
    allow_root_runs: Annotated[
        bool,
        typer.Option(
            "--allow-root-runs",
            help="When root and the runner user does not exist, run nested "
            "evaluations as root anyway (default: measure nothing and write failure values).",
        ),
    ] = False,
    unfenced_candidates: Annotated[
        bool,
        typer.Option(
            "--unfenced-candidates",
            help="Let kind: agent candidate hosts use this process's network (by default they reach "
            "only their gateway, which needs CAP_NET_ADMIN and nftables, and a target whose fence "
            "cannot be installed is not measured; for a verifier run outside a container).",
        ),
    ] = False,
    subreaper: Annotated[
        bool,
        typer.Option(
            "--subreaper",
            help="Run the verification in a child of this process, which adopts and reaps the "
            "orphans that nested runs and candidate hosts leave (for containers whose PID 1 does not "
            "reap, such as Modal's sandboxes; the compiled tests/test.sh sets it).",
        ),
    ] = False,
) -> None:
    """Run `vero.verifier.verify` with the real Harbor backend; print the outcome as JSON."""
    if subreaper:
        from vero.core.reaper import run_reaped

        raise typer.Exit(
            run_reaped(
                lambda: verify_command(
                    config=config,
                    session=session,
                    cases_dir=cases_dir,
                    baseline_dir=baseline_dir,
                    reward_path=reward_path,
                    artifacts_dir=artifacts_dir,
                    mirror_dirs=mirror_dirs,
                    work_dir=work_dir,
                    runner_user=runner_user,
                    allow_root_runs=allow_root_runs,
                    unfenced_candidates=unfenced_candidates,
                )
            )
        )
    import tempfile

    from vero.core.run import nested_secret_env
    from vero.spec.compiled import VerifierConfig, load_config
    from vero.spec.environments import drop_empty_settings
    from vero.verifier import VerifierPaths, resolve_run_as, verify

    _configure_logging()

    def call():
        from vero.harbor import HarborBackend
        from vero.harbor.leftovers import new_session_id

        loaded = load_config(config, VerifierConfig)
        mirrors = mirror_dirs if mirror_dirs is not None else [Path(_P.artifacts_mirror)]
        mirrors = [m for m in mirrors if m.resolve() != artifacts_dir.resolve()]
        work = work_dir or Path(tempfile.mkdtemp(prefix="vero-verify-"))
        drop_empty_settings(loaded.settings, os.environ)
        env = nested_secret_env([*loaded.secrets, *loaded.settings], os.environ, loaded.inference)
        backend = HarborBackend(session=new_session_id("verify"))
        if not unfenced_candidates:
            from vero.harbor.boundary.fence import NetworkFence

            backend.confine_candidates(NetworkFence())  # the verifier serves nothing to other hosts
        paths = VerifierPaths(
            session_archive=session,
            cases_dir=cases_dir,
            baseline_dir=baseline_dir,
            reward_path=reward_path,
            artifacts_dir=artifacts_dir,
            work_dir=work,
            mirror_dirs=tuple(mirrors),
        )
        verification = verify(
            loaded,
            paths,
            backend,
            env=env,
            run_as=resolve_run_as(runner_user),
            allow_root_runs=allow_root_runs,
        )
        try:
            return asyncio.run(_until_terminated(verification, backend))
        except asyncio.CancelledError:
            # Stopped (SIGTERM): the reward file holds the failure values written first; the nested
            # runs were killed and their leftovers removed on the way out.
            typer.echo("error: the verification was stopped (SIGTERM); failure values stand", err=True)
            raise typer.Exit(128 + signal.SIGTERM) from None

    finalization = run_command(call)
    typer.echo(
        json.dumps(
            {
                "status": finalization.status,
                "rewards": finalization.rewards,
                "chosen": finalization.chosen.model_dump(mode="json") if finalization.chosen else None,
                "verdicts": {v.partition: v.summary() for v in finalization.verdicts},
                "errors": finalization.errors,
            },
            indent=2,
            sort_keys=True,
        )
    )
    raise typer.Exit(VERIFIER_STATUS_EXIT_CODES.get(finalization.status, EXIT_FAILED))


def report_command(
    session: Annotated[Path, typer.Argument(help="The sealed session archive (its .sha256 beside it).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("experiment.html"),
    finalization: Annotated[
        Path | None,
        typer.Option(
            "--finalization",
            help="A finalization.json to include. Default: the one beside the "
            "archive, if it was made from this archive.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A verifier or sidecar config whose spec digest and baseline commit "
            "the archive must match. Default: the archive's own manifest.",
        ),
    ] = None,
) -> None:
    """Run `vero.verifier.report.report_from_archive`; print the output path as JSON."""

    def call() -> Path:
        from vero.verifier.report import report_from_archive

        spec_digest = baseline_commit = None
        if config is not None:
            from pydantic import BaseModel, ConfigDict

            from vero.spec.compiled import load_config

            class _Digests(BaseModel):
                # Either role's config carries both fields; the rest is not needed here.
                model_config = ConfigDict(extra="ignore")
                schema_version: int = 1
                spec_digest: str
                baseline_commit: str

            digests = load_config(config, _Digests)
            spec_digest, baseline_commit = digests.spec_digest, digests.baseline_commit
        return report_from_archive(
            session, output, finalization=finalization, spec_digest=spec_digest, baseline_commit=baseline_commit
        )

    path = run_command(call)
    typer.echo(json.dumps({"output": str(path)}))


async def _until_terminated[T](work: Coroutine[Any, Any, T], backend: HarborBackend) -> T:
    """Await `work`; on SIGTERM (Docker stopping the verifier's container, Harbor's verifier
    timeout) interrupt the backend (no kill grace) and cancel `work`, so its nested runs are killed
    and their containers removed inside the stop grace instead of outliving the verifier."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)

    def terminate() -> None:
        logger.warning("SIGTERM: stopping the verification")
        backend.interrupt()
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _configure_logging() -> None:
    root = logging.getLogger("vero")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
