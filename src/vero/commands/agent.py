"""`vero harbor status|eval|result|submit`: the coding agent's commands, talking to the sidecar.

Output is made for programs first: stdout carries exactly one JSON document (the sidecar's wire
shape, or `{"error": {...}}` when the command fails), progress and messages go to stderr, and the
exit code says what happened (`vero.commands.exit_codes`). `--text` prints a short human summary
instead. These commands import httpx and the wire models only, never FastAPI or Harbor.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from vero.cli import harbor_app
from vero.commands.exit_codes import EXIT_FAILED, EXIT_OK, exit_code_for, run_command
from vero.errors import VeroError

if TYPE_CHECKING:
    from vero.sidecar.client import SidecarClient
    from vero.sidecar.models import JobView, StatusResponse, SubmissionView

_EPILOG = (
    "Output: one JSON document on stdout (with --text: a short summary); on failure "
    '{"error": {"type", "exit_code", "message"}} on stdout and the message on stderr. '
    "Exit codes: 0 ok; 1 the job failed or was cancelled, or is still running when --timeout-sec "
    "elapses; 2 bad usage (HTTP 422); 3 denied by policy or entrance closed (403); 4 out of budget "
    "(402); 5 infrastructure failure, budget refunded (502); 6 conflict (409); 7 unknown job (404); "
    "8 sidecar unreachable; 9 version rejected (400)."
)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="VERO_SIDECAR_URL",
        show_envvar=True,
        help="Base URL of the evaluation sidecar (default: http://eval-sidecar:8000).",
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json/--text",
        help="Print the result as one JSON document on stdout (default), or as a short text summary.",
    ),
]
WaitOption = Annotated[
    bool,
    typer.Option(
        "--wait",
        "-w",
        help="Poll the job until it completes, fails or is cancelled, showing progress on stderr; "
        "then print the final job.",
    ),
]
PollOption = Annotated[
    float,
    typer.Option("--poll-interval-sec", min=0.05, help="With --wait: pause between polls that come back early (each poll is a long poll the sidecar answers when the job finishes)."),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout-sec",
        min=0,
        help="With --wait: stop waiting after this many seconds (the job keeps running; exit 1). "
        "Default: wait until the job ends.",
    ),
]
VersionOption = Annotated[
    str,
    typer.Option("--version", "-v", help="Commit-ish in your repository: HEAD, a branch, or a commit id."),
]


@harbor_app.command(
    "status",
    epilog=_EPILOG,
    help="Show what you may evaluate: partitions, their cases and disclosure, remaining budgets, "
    "your jobs and your submission.",
)
def status(url: UrlOption = None, as_json: JsonOption = True) -> None:
    """Print `GET /status` (a `StatusResponse`)."""

    def call() -> StatusResponse:
        with _client(url) as client:
            return client.status()

    view = _run(call, as_json)
    _emit(view, as_json, _status_text)


@harbor_app.command(
    "eval",
    epilog=_EPILOG,
    help="Start an evaluation of a version on a partition and print the job; use its `id` with "
    "`vero harbor result`.\n\n"
    "The version is captured and the budget (1 run plus one case per selected case) reserved before "
    "this returns: commit first, uncommitted changes are not evaluated. Without --wait it returns at "
    "once, with the job queued or running.",
)
def evaluate(
    partition: Annotated[
        str, typer.Option("--partition", "-p", help="Partition to evaluate on (see `vero harbor status`).")
    ],
    version: VersionOption = "HEAD",
    cases: Annotated[
        list[str] | None,
        typer.Option(
            "--case",
            "-c",
            help="Evaluate only this case of the partition; repeat for several. Default: every case. "
            "On an `aggregate` partition the cases must make up whole blocks (see `vero harbor status`).",
        ),
    ] = None,
    blocks: Annotated[
        list[int] | None,
        typer.Option(
            "--block",
            "-b",
            min=0,
            help="`aggregate` partitions: evaluate this block (its position from 0, as listed by "
            "`vero harbor status`); repeat for several. Not together with --case.",
        ),
    ] = None,
    wait: WaitOption = False,
    poll_interval_sec: PollOption = 2.0,
    timeout_sec: TimeoutOption = None,
    url: UrlOption = None,
    as_json: JsonOption = True,
) -> None:
    """`POST /evaluations`, then optionally poll; prints a `JobView`, exits by the job's state."""
    _show_job(lambda client: client.evaluate(partition, version=version, cases=cases or None, blocks=blocks or None),
              url, as_json, wait, poll_interval_sec, timeout_sec)


@harbor_app.command(
    "result",
    epilog=_EPILOG,
    help="Show an evaluation job: its state and, once complete, the result its partition discloses.",
)
def result(
    job_id: Annotated[str, typer.Argument(help="Job id, as printed by `vero harbor eval`.")],
    wait: WaitOption = False,
    poll_interval_sec: PollOption = 2.0,
    timeout_sec: TimeoutOption = None,
    url: UrlOption = None,
    as_json: JsonOption = True,
) -> None:
    """`GET /evaluations/{id}`, optionally polled; prints a `JobView`, exits by the job's state."""
    _show_job(lambda client: client.job(job_id), url, as_json, wait, poll_interval_sec, timeout_sec)


@harbor_app.command(
    "submit",
    epilog=_EPILOG,
    help="Submit a version as your final candidate: the verifier scores it on the hidden partitions. "
    "Commit first.",
)
def submit(version: VersionOption = "HEAD", url: UrlOption = None, as_json: JsonOption = True) -> None:
    """`POST /submissions`; prints a `SubmissionView`."""

    def call() -> SubmissionView:
        with _client(url) as client:
            return client.submit(version)

    view = _run(call, as_json)
    _emit(view, as_json, _submission_text)


# -- helpers --------------------------------------------------------------------------------------


def _client(url: str | None) -> SidecarClient:
    from vero.sidecar.client import SidecarClient

    return SidecarClient(url or None)


def _run[T](func: Callable[[], T], as_json: bool) -> T:
    """`run_command`, plus the error as JSON on stdout so that stdout always parses."""

    def guarded() -> T:
        try:
            return func()
        except VeroError as exc:
            if as_json:
                error = {"type": type(exc).__name__, "exit_code": exit_code_for(exc), "message": str(exc)}
                typer.echo(json.dumps({"error": error}, indent=2))
            raise

    return run_command(guarded)


def _emit[V](view: V, as_json: bool, as_text: Callable[[V], str]) -> None:
    typer.echo(view.model_dump_json(indent=2) if as_json else as_text(view))  # type: ignore[attr-defined]


def _show_job(fetch: Callable[[SidecarClient], JobView], url: str | None, as_json: bool, wait: bool,
              poll_interval_sec: float, timeout_sec: float | None) -> NoReturn:
    """The tail `eval` and `result` share: fetch the job, optionally wait, print it, exit by its state.

    Exit 0 when the job is complete, or still queued/running without --wait; 1 when it failed or was
    cancelled, or --timeout-sec elapsed first. A job that failed for infrastructure reasons never
    gets here: the sidecar answers it with 502, which `SidecarClient` raises as
    `InfrastructureFailure` (exit 5).
    """

    def call() -> JobView:
        with _client(url) as client:
            view = fetch(client)
            return _wait(client, view, poll_interval_sec, timeout_sec) if wait else view

    view = _run(call, as_json)
    _emit(view, as_json, _job_text)
    done_ok = view.state == "complete" or (not wait and view.state in ("queued", "running"))
    raise typer.Exit(EXIT_OK if done_ok else EXIT_FAILED)


def _wait(client: SidecarClient, view: JobView, poll_interval_sec: float, timeout_sec: float | None) -> JobView:
    """Poll with a progress line on stderr; stdout stays untouched."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from vero.sidecar.client import JOB_TERMINAL_STATES

    if view.state in JOB_TERMINAL_STATES:
        return view
    console = Console(stderr=True)
    head = f"job {view.id} ({view.partition}, {view.n_cases} case{'s' if view.n_cases != 1 else ''})"
    last_state = [view.state]
    console.print(f"{head}: {view.state}", highlight=False)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True,
        # On a pipe (an agent's tool call) the state-change lines below are the whole display.
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(f"{head}: {view.state}", total=None)

        def on_update(current: JobView) -> None:
            progress.update(task, description=f"{head}: {current.state}")
            if current.state != last_state[0]:
                last_state[0] = current.state
                # Printed above the live line, so a non-terminal stderr (an agent's log) sees it too.
                progress.console.print(f"{head}: {current.state}", highlight=False)

        try:
            final = client.wait(view.id, poll_interval_sec=poll_interval_sec, timeout_sec=timeout_sec,
                                on_update=on_update)
        except KeyboardInterrupt:
            console.print(f"stopped waiting; the job keeps running: vero harbor result {view.id} --wait",
                          highlight=False)
            raise
    if final.state not in JOB_TERMINAL_STATES:
        console.print(f"{head}: still {final.state} after {timeout_sec:g}s; the job keeps running: "
                      f"vero harbor result {view.id} --wait", highlight=False)
    return final


def _status_text(view: StatusResponse) -> str:
    lines = [f"{view.name}: entrance {'open' if view.entrance_open else 'closed'}, "
             f"submissions {'enabled' if view.submit_enabled else 'disabled'}"]
    for p in view.partitions:
        line = f"partition {p.name}: {len(p.cases)} cases, disclosure {p.disclosure}"
        if p.blocks is not None:
            line += (" (the whole partition only)" if len(p.blocks) == 1
                     else f" (the whole partition or unions of its {len(p.blocks)} blocks)")
        if p.ladder is not None:
            line += f", ladder mode (margin {p.ladder.margin:g}, precision {p.ladder.precision:g})"
        if p.budget is not None:
            b = p.budget
            line += (f", runs left {b.remaining_runs}/{b.total_runs}, "
                     f"cases left {b.remaining_cases}/{b.total_cases}")
        lines.append(line)
        if p.blocks is not None and len(p.blocks) > 1:
            lines.extend(f"  block {index}: {', '.join(block)}" for index, block in enumerate(p.blocks))
    lines.extend(_job_line(job) for job in view.jobs)
    if view.submission is not None:
        lines.append(_submission_text(view.submission))
    return "\n".join(lines)


def _job_line(view: JobView) -> str:
    line = (f"job {view.id}: {view.state}, partition {view.partition}, {view.n_cases} cases, "
            f"version {view.version} ({view.candidate[:12]})")
    if view.error:
        line += f", reason {view.error}"
    if view.result is not None and view.result.score is not None:
        line += f", score {view.result.score:g}"
        if view.result.improved is False:
            line += " (not improved: the best disclosed before)"
    return line


def _job_text(view: JobView) -> str:
    lines = [_job_line(view)]
    r = view.result
    if r is not None:
        if r.score is None:
            lines.append(f"result: disclosure {r.disclosure} (no score disclosed)")
        elif r.improved is not None:
            lines.append(f"result: score {r.score:g} over {r.n_cases} cases, "
                         + ("improved by at least the margin" if r.improved
                            else "not improved: the best score disclosed before is repeated"))
        else:
            lines.append(f"result: score {r.score:g} over {r.n_cases} cases, {r.n_attempts} attempts, "
                         f"{r.n_dead} without a reward")
        for case in r.cases or []:
            rewards = ", ".join("dead" if a.reward is None else f"{a.reward:g}" for a in case.attempts)
            lines.append(f"  case {case.case}: score {case.score:g} (attempts: {rewards})")
        if r.artifacts_path:
            lines.append(f"artifacts: {r.artifacts_path}")
    return "\n".join(lines)


def _submission_text(view: SubmissionView) -> str:
    return (f"submission: version {view.version} (candidate {view.candidate}) "
            f"at {view.submitted_at.isoformat()}")
