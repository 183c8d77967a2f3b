"""Names of the nested Harbor jobs of one evaluation.

The first round is the job `<evaluation_id>`; each infrastructure retry round is the job
`<evaluation_id>.retry-<n>` (n = 1, 2, ...), in the same jobs dir (`vero.harbor.runner`). Readers of
a finished evaluation's trials (`vero.sidecar.artifacts`) find the retry rounds from here too.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["job_dirs_of", "round_job_name"]

_RETRY = re.compile(r"\.retry-([1-9][0-9]*)$")


def round_job_name(evaluation_id: str, round_index: int) -> str:
    """Harbor's `--job-name` of round `round_index` (0: the first round) of an evaluation."""
    return evaluation_id if round_index == 0 else f"{evaluation_id}.retry-{round_index}"


def job_dirs_of(first_job_dir: Path) -> list[Path]:
    """The first round's job dir and its retry rounds' dirs that exist, in round order.

    Links are skipped: a job dir is only ever a real directory Harbor created.
    """
    parent, name = first_job_dir.parent, first_job_dir.name
    rounds: list[tuple[int, Path]] = []
    if parent.is_dir():
        for path in parent.glob(f"{name}.retry-*"):
            match = _RETRY.fullmatch(path.name, len(name))
            if match and not path.is_symlink():
                rounds.append((int(match.group(1)), path))
    return [first_job_dir, *(path for _, path in sorted(rounds))]
