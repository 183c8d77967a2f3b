"""`experiment.html`: one self-contained page about a session and its verification.

The page is rendered with Jinja2 from `verifier/report.html.j2` (found through `vero._assets`),
autoescaped. It loads nothing: no script, no external stylesheet, font or image, and a
Content-Security-Policy of `default-src 'none'` (inline styles only) makes any later slip show up
as a blocked load instead of a silent fetch. The plots are inline SVG whose geometry is computed
here from the records:

- scores per partition over time: every completed evaluation of the session (filled dot: full
  partition; hollow: subset), full-partition evaluations joined per partition, and the verifier's
  own measurements (diamonds) at the seal time;
- budget burn: the share of each partition's case budget charged over time (completed
  evaluations stay charged; failed and cancelled ones are refunded, docs/agent-api.md);
- per target, the paired plot of its verdict (`vero.verifier.verdict`): each case's baseline score
  (ring) and candidate score (dot) joined by a segment, green where the candidate is better in the
  scoring direction, orange where it is worse; a case where an arm has no evidence shows only the
  other arm. The baseline's own target measurement (`target-baseline`) is plotted there only.

Tables list the candidates, the evaluations, the budgets and, when a `Finalization` is given, the
shipped candidate, how it was chosen and the rewards.
"""

from __future__ import annotations

import math
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from vero.core.archive import file_digest
from vero.core.diagnostics import RunDiagnostics
from vero.core.jobs import EvaluationJob
from vero.core.ledger import AGENT_INFERENCE_PARTITION, BudgetBalance
from vero.core.session import SealManifest, Session, read_session
from vero.core.storage import atomic_write_bytes
from vero.errors import SessionInvalid
from vero.verifier.artifacts import FINALIZATION_FILE, Finalization, build_status
from vero.verifier.verdict import Verdict

__all__ = ["REPORT_FILE", "REPORT_TEMPLATE", "read_manifest", "render_report", "report_from_archive", "write_report"]

REPORT_FILE = "experiment.html"
REPORT_TEMPLATE = "report.html.j2"

PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#7f7f7f", "#000000")
"""Okabe-Ito colours (distinguishable with colour-vision deficiencies), one per partition."""

_WIDTH, _HEIGHT = 760, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 20, 16, 44


@dataclass
class Marker:
    """One plotted point, in SVG user units."""

    x: float
    y: float
    color: str
    shape: str
    """`dot` (full-partition evaluation), `ring` (subset), `diamond` (verifier measurement)."""
    title: str


@dataclass
class Series:
    name: str
    color: str
    points: str = ""
    """SVG `points` of the polyline joining the series (may be empty)."""


@dataclass
class Plot:
    """An SVG plot: frame, ticks, series lines, markers and a legend."""

    id: str
    title: str
    y_label: str
    width: int = _WIDTH
    height: int = _HEIGHT
    left: int = _LEFT
    top: int = _TOP
    inner_width: int = _WIDTH - _LEFT - _RIGHT
    inner_height: int = _HEIGHT - _TOP - _BOTTOM
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    legend: list[tuple[str, str, str]] = field(default_factory=list)
    """(label, colour, shape) rows."""
    marks: list[tuple[float, str]] = field(default_factory=list)
    """Labelled vertical lines (x, label), e.g. the seal."""
    empty_message: str | None = None
    x_label: str = "time since the first evaluation"


class _Scale:
    """Linear map from a data interval to a pixel interval (a degenerate interval is widened)."""

    def __init__(self, lo: float, hi: float, out_lo: float, out_hi: float):
        if hi <= lo:
            pad = abs(lo) * 0.1 or 0.5
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.out_lo, self.out_hi = lo, hi, out_lo, out_hi

    def __call__(self, value: float) -> float:
        return round(self.out_lo + (value - self.lo) / (self.hi - self.lo) * (self.out_hi - self.out_lo), 2)

    def ticks(self, n: int = 5) -> list[float]:
        step = _nice_step((self.hi - self.lo) / max(n - 1, 1))
        first = math.ceil(self.lo / step - 1e-9) * step
        values: list[float] = []
        value = first
        while value <= self.hi + step * 1e-9 and len(values) < 20:
            values.append(round(value, 12))
            value += step
        return values


def _nice_step(raw: float) -> float:
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    exponent = math.floor(math.log10(raw))
    fraction = raw / 10**exponent
    nice = 1 if fraction <= 1 else 2 if fraction <= 2 else 5 if fraction <= 5 else 10
    return nice * 10**exponent


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _fmt_minutes(minutes: float) -> str:
    if minutes >= 120:
        return f"+{minutes / 60:.3g} h"
    return f"+{minutes:.3g} min"


def _colors(partitions: list[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(sorted(partitions))}


def _ended_at(job: EvaluationJob) -> datetime:
    """Where a job sits on the time axis: when it finished, else when it was created."""
    return job.finished_at or job.created_at


def _time_axis(plot: Plot, session: Session, jobs: list[EvaluationJob]) -> Callable[[datetime], float]:
    """Set `plot`'s x ticks and seal mark; returns moment -> x (SVG units).

    The axis runs in minutes from the session's first evaluation (the seal, when there is none) to
    the seal or the last of `jobs`, whichever is later.
    """
    start = min([j.created_at for j in session.jobs] + [session.manifest.sealed_at])
    end = session.manifest.sealed_at

    def minutes(moment: datetime) -> float:
        return (moment - start).total_seconds() / 60

    scale = _Scale(
        0.0, max([minutes(end)] + [minutes(_ended_at(j)) for j in jobs]), plot.left, plot.left + plot.inner_width
    )
    plot.x_ticks = [(scale(v), _fmt_minutes(v)) for v in scale.ticks()]
    plot.marks = [(scale(minutes(end)), "sealed")]
    return lambda moment: scale(minutes(moment))


def _score_plot(session: Session, finalization: Finalization | None, colors: dict[str, str]) -> Plot:
    plot = Plot(id="score-plot", title="Scores per partition over time", y_label="score")
    scores = {j.id: j.result.score for j in session.jobs if j.state == "complete" and j.result is not None}
    jobs = [j for j in session.jobs if j.id in scores]
    verifier = [
        (m, m.score)
        for m in (finalization.measurements if finalization else [])
        if m.score is not None and m.purpose != "target-baseline"  # the verdict's plot shows it
    ]
    if not jobs and not verifier:
        plot.empty_message = "No completed evaluation in this session."
        return plot
    x = _time_axis(plot, session, jobs)
    values = [*scores.values(), *(score for _, score in verifier)]
    pad = (max(values) - min(values)) * 0.05
    y = _Scale(min(values) - pad, max(values) + pad, plot.top + plot.inner_height, plot.top)
    plot.y_ticks = [(y(v), _fmt(v)) for v in y.ticks()]
    for partition in sorted({j.partition for j in jobs}):
        mine = sorted((j for j in jobs if j.partition == partition), key=lambda j: (_ended_at(j), j.id))
        plot.series.append(
            Series(
                name=partition,
                color=colors[partition],
                points=" ".join(f"{x(_ended_at(j))},{y(scores[j.id])}" for j in mine if j.full_partition),
            )
        )
        for job in mine:
            plot.markers.append(
                Marker(
                    x=x(_ended_at(job)),
                    y=y(scores[job.id]),
                    color=colors[partition],
                    shape="dot" if job.full_partition else "ring",
                    title=f"{job.id} {partition} {job.candidate[:12]} score {_fmt(scores[job.id])} "
                    f"({'full partition' if job.full_partition else f'{len(job.cases)} cases'})",
                )
            )
        plot.legend.append((partition, colors[partition], "dot"))
    for measurement, score in verifier:
        color = colors.get(measurement.partition, PALETTE[-1])
        plot.markers.append(
            Marker(
                x=x(session.manifest.sealed_at),
                y=y(score),
                color=color,
                shape="diamond",
                title=f"verifier {measurement.purpose} {measurement.partition} {measurement.candidate[:12]} "
                f"score {_fmt(score)}",
            )
        )
        if not any(label == measurement.partition for label, _, _ in plot.legend):
            plot.legend.append((measurement.partition, color, "diamond"))
    plot.legend.append(("subset evaluation", "#555555", "ring"))
    if verifier:
        plot.legend.append(("verifier measurement (after the seal)", "#555555", "diamond"))
    return plot


def _partition_balances(session: Session) -> list[BudgetBalance]:
    """The session's budgets of partitions (the coding agent's own inference entry is not one)."""
    return [b for b in session.balances if b.partition != AGENT_INFERENCE_PARTITION]


def _burn_plot(session: Session, colors: dict[str, str]) -> Plot:
    plot = Plot(id="budget-plot", title="Case budget spent over time", y_label="% of case budget")
    totals: dict[str, int] = {}
    for balance in _partition_balances(session):
        totals[balance.partition] = totals.get(balance.partition, 0) + balance.total_cases
    if not totals:
        plot.empty_message = "The session has no budget entries."
        return plot
    charged = [j for j in session.jobs if j.state == "complete" and j.partition in totals]
    x = _time_axis(plot, session, charged)
    y = _Scale(0.0, 100.0, plot.top + plot.inner_height, plot.top)
    plot.y_ticks = [(y(v), _fmt(v)) for v in (0, 25, 50, 75, 100)]
    for partition in sorted(totals):
        total, color = totals[partition], colors.get(partition, PALETTE[-1])

        def share(spent: int, total: int = total) -> float:
            return min(100.0, 100.0 * spent / total) if total else 0.0

        spent, points = 0, [f"{float(plot.left)},{y(0.0)}"]  # nothing spent at the axis origin
        for job in sorted((j for j in charged if j.partition == partition), key=lambda j: (_ended_at(j), j.id)):
            at = x(_ended_at(job))
            points.append(f"{at},{y(share(spent))}")
            spent += len(job.cases)
            points.append(f"{at},{y(share(spent))}")
            plot.markers.append(
                Marker(
                    x=at,
                    y=y(share(spent)),
                    color=color,
                    shape="dot",
                    title=f"{job.id}: {spent} of {total} cases spent on {partition}",
                )
            )
        points.append(f"{x(session.manifest.sealed_at)},{y(share(spent))}")
        plot.series.append(Series(name=partition, color=color, points=" ".join(points)))
        plot.legend.append((f"{partition} ({total} cases)", color, "dot"))
    return plot


BETTER, WORSE, EVEN = "#009e73", "#d55e00", "#7f7f7f"
"""Segment colours of the paired plot: the candidate better, worse, or equal on a case."""
CANDIDATE_COLOR, BASELINE_COLOR = "#0072b2", "#555555"


def _verdict_plot(verdict: Verdict) -> Plot:
    """The per-case paired plot of one target's verdict (see the module docstring)."""
    plot = Plot(
        id=f"verdict-plot-{verdict.partition}",
        title=f"{verdict.partition}: each case, the candidate beside the baseline",
        y_label="case score",
        x_label="case",
        height=260,
        inner_height=260 - _TOP - _BOTTOM,
    )
    values = [v for c in verdict.cases for v in (c.candidate, c.baseline) if v is not None]
    if not values:
        plot.empty_message = "No case has a measurement."
        return plot
    pad = (max(values) - min(values)) * 0.08
    y = _Scale(min(values) - pad, max(values) + pad, plot.top + plot.inner_height, plot.top)
    plot.y_ticks = [(y(v), _fmt(v)) for v in y.ticks()]
    n = len(verdict.cases)
    step = plot.inner_width / n
    every = max(1, math.ceil(n / 16))  # at most 16 labels; every case keeps its markers and titles
    for index, case in enumerate(verdict.cases):
        x = round(plot.left + (index + 0.5) * step, 2)
        if index % every == 0:
            plot.x_ticks.append((x, case.case if len(case.case) <= 14 else case.case[:13] + "…"))
        if case.candidate is not None and case.baseline is not None and not verdict.baseline_shipped:
            lift = case.lift or 0.0
            color = BETTER if lift > 0 else WORSE if lift < 0 else EVEN
            plot.series.append(
                Series(
                    name=f"{case.case}: lift {_fmt(lift)}",
                    color=color,
                    points=f"{x},{y(case.baseline)} {x},{y(case.candidate)}",
                )
            )
        for value, color, shape, arm in (
            (case.baseline, BASELINE_COLOR, "ring", "baseline"),
            (case.candidate, CANDIDATE_COLOR, "dot", "candidate"),
        ):
            if value is None or (arm == "baseline" and verdict.baseline_shipped):
                continue
            plot.markers.append(
                Marker(x=x, y=y(value), color=color, shape=shape, title=f"{case.case}: {arm} {_fmt(value)}")
            )
    plot.legend = [("candidate (shipped)", CANDIDATE_COLOR, "dot")]
    if not verdict.baseline_shipped and verdict.compared:
        plot.legend += [
            ("baseline", BASELINE_COLOR, "ring"),
            ("candidate better", BETTER, "line"),
            ("candidate worse", WORSE, "line"),
        ]
    return plot


def _candidate_rows(session: Session, finalization: Finalization | None) -> list[dict]:
    shipped = finalization.chosen.candidate if finalization and finalization.chosen else None
    submitted = session.submission.candidate if session.submission else None
    rows = []
    for record in session.candidates:
        mine = [j for j in session.jobs if j.candidate == record.id and j.state == "complete" and j.result]
        per_partition = {}
        for partition in sorted({j.partition for j in mine}):
            full = [j.result.score for j in mine if j.result and j.partition == partition and j.full_partition]
            subset = [j.result.score for j in mine if j.result and j.partition == partition and not j.full_partition]
            per_partition[partition] = {
                "full_mean": _fmt(sum(full) / len(full)) if full else "",
                "n_full": len(full),
                "n_subset": len(subset),
            }
        tags = []
        if record.id == session.manifest.baseline_commit:
            tags.append("baseline")
        if record.id == submitted:
            tags.append("submitted")
        if record.id == shipped:
            tags.append("shipped")
        rows.append(
            {
                "id": record.id,
                "short": record.id[:12],
                "tree": record.tree[:12],
                "subject": record.subject,
                "imported_at": record.imported_at.isoformat(timespec="seconds"),
                "partitions": per_partition,
                "tags": tags,
            }
        )
    return rows


def _jobs_with_causes(jobs: list[EvaluationJob]) -> list[tuple[EvaluationJob, RunDiagnostics]]:
    """(job, its diagnostics) for each evaluation that failed with a recorded cause or completed
    with failed trials, in job order."""
    found = []
    for job in jobs:
        diagnostics = job.diagnostics
        if diagnostics is None and job.result is not None:
            kept = job.result.diagnostics
            diagnostics = kept if kept is not None and (kept.trial_failures or kept.problems) else None
        if diagnostics is not None and not diagnostics.empty:
            found.append((job, diagnostics))
    return found


def render_report(session: Session | None, finalization: Finalization | None = None) -> str:
    """Render `experiment.html`.

    Args:
        session: the verified session, or None when it was refused (the page then shows the
            finalization only).
        finalization: the verification outcome, or None (e.g. `vero report` on an archive alone).

    Returns:
        The HTML document (UTF-8 text). Same inputs -> same text (no render time is included).

    Raises:
        ValueError: both arguments are None.
        FileNotFoundError: the template is missing (a broken installation).
    """
    import jinja2

    from vero._assets import asset_dir, template_environment

    if session is None and finalization is None:
        raise ValueError("a report needs a session or a finalization")
    env = template_environment(jinja2.FileSystemLoader(asset_dir("verifier")), autoescape=True)
    context: dict = {
        "session": session,
        "finalization": finalization,
        "fmt": _fmt,
        "verdict_plots": {v.partition: _verdict_plot(v) for v in (finalization.verdicts if finalization else [])},
    }
    if session is not None:
        partitions = sorted(
            {j.partition for j in session.jobs}
            | {b.partition for b in _partition_balances(session)}
            | ({m.partition for m in finalization.measurements} if finalization else set())
        )
        colors = _colors(partitions)
        context.update(
            name=session.manifest.name,
            status=build_status(session),
            plots=[_score_plot(session, finalization, colors), _burn_plot(session, colors)],
            candidates=_candidate_rows(session, finalization),
            jobs=session.jobs,
            failed_jobs=_jobs_with_causes(session.jobs),
            colors=colors,
        )
    else:
        assert finalization is not None  # one of the two is set (checked above)
        context.update(name=finalization.name, status=None, plots=[], candidates=[], jobs=[], failed_jobs=[], colors={})
    return env.get_template(REPORT_TEMPLATE).render(**context)


def write_report(path: str | Path, session: Session | None, finalization: Finalization | None = None) -> Path:
    """Render the report and write it atomically to `path` (mode 0644); returns `path`.

    Raises:
        ValueError, FileNotFoundError: see `render_report`. OSError: `path` cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, render_report(session, finalization).encode("utf-8"), mode=0o644)
    return path


def read_manifest(archive: str | Path) -> SealManifest:
    """Read `manifest.json` from a session archive without verifying anything else.

    Only for finding the digests to verify the archive against when no compiled config is at
    hand (`vero report`); `read_session` then checks the archive against them.

    Raises:
        SessionInvalid: the archive cannot be opened or has no valid manifest.
    """
    try:
        with tarfile.open(archive, "r:gz") as tar:
            member = tar.getmember("manifest.json")
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is None:
                raise KeyError("manifest.json")
            data = handle.read()
    except (OSError, KeyError, tarfile.TarError, EOFError):
        raise SessionInvalid("the session archive cannot be opened or has no manifest") from None
    try:
        return SealManifest.model_validate_json(data)
    except ValueError:
        raise SessionInvalid("the session manifest is malformed") from None


def report_from_archive(
    archive: str | Path,
    output: str | Path,
    *,
    finalization: str | Path | None = None,
    spec_digest: str | None = None,
    baseline_commit: str | None = None,
) -> Path:
    """Render `experiment.html` from a sealed session archive (`vero report`).

    The archive is verified like the verifier does (`.sha256`, manifest digests, bundle); against
    `spec_digest`/`baseline_commit` when given, else against its own manifest's values.

    Args:
        archive: `session.tar.gz` with its `.sha256` beside it.
        output: the HTML file to write.
        finalization: a `finalization.json` to include. Default: `finalization.json` beside the
            archive, used only when its `session_sha256` names this archive; none otherwise.
        spec_digest, baseline_commit: expected values (e.g. from the verifier's config).

    Returns:
        `output`.

    Raises:
        SessionInvalid: the archive fails its checks, or an explicitly given `finalization` is
            unreadable or belongs to another archive.
        OSError: `output` cannot be written.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise SessionInvalid(f"the session archive {archive} does not exist")
    # The outer digest first, so a corrupt archive is reported as such rather than as unreadable.
    try:
        recorded = Path(f"{archive}.sha256").read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError):
        raise SessionInvalid("the session archive has no readable .sha256 beside it") from None
    try:
        sha256 = file_digest(archive).removeprefix("sha256:")
    except OSError:
        raise SessionInvalid("the session archive cannot be read") from None
    if recorded != sha256:
        raise SessionInvalid("the session archive does not match its sha256")
    manifest = read_manifest(archive)
    found = _finalization_for(archive, sha256, Path(finalization) if finalization else None)
    with tempfile.TemporaryDirectory(prefix="vero-report-") as tmp:
        session = read_session(
            archive,
            Path(tmp) / "session",
            spec_digest=spec_digest or manifest.spec_digest,
            baseline_commit=baseline_commit or manifest.baseline_commit,
        )
        return write_report(output, session, found)


def _finalization_for(archive: Path, sha256: str, explicit: Path | None) -> Finalization | None:
    """The finalization made from the archive whose hex digest is `sha256`: `explicit`, else the
    `finalization.json` beside the archive (ignored, rather than refused, when it does not match)."""
    path = explicit or archive.parent / FINALIZATION_FILE
    if explicit is None and not path.is_file():
        return None
    try:
        loaded = Finalization.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        if explicit is None:
            return None
        raise SessionInvalid(f"the finalization {path} cannot be read") from None
    if loaded.session_sha256 != sha256:
        if explicit is None:
            return None
        raise SessionInvalid(f"the finalization {path} belongs to another session archive")
    return loaded
