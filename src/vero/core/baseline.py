"""The deterministic baseline commit (DESIGN §5).

INTERFACE SKELETON — signatures and docstrings are the contract; bodies are to be implemented.

The compiler, the `main` image build, the sidecar and the verifier each rebuild the baseline commit
from the same files and must get the same commit id. Everything that feeds the id is fixed:
author and committer `vero <vero@localhost>`, dates `1970-01-01T00:00:00+0000` (epoch 0), message
`baseline\n`, no parent, every file added (`git add -A -f`, ignoring `.gitignore`), no
`core.autocrlf`, file modes as on disk (0644 or 0755; symlinks as links).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BASELINE_GIT_ENV", "BASELINE_MESSAGE", "commit_baseline"]

BASELINE_MESSAGE = "baseline"
BASELINE_GIT_ENV: dict[str, str] = {
    "GIT_AUTHOR_NAME": "vero",
    "GIT_AUTHOR_EMAIL": "vero@localhost",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "vero",
    "GIT_COMMITTER_EMAIL": "vero@localhost",
    "GIT_COMMITTER_DATE": "1970-01-01T00:00:00+0000",
}
"""Environment that pins the baseline commit's identity and dates (also used by the main Dockerfile)."""


def commit_baseline(work_tree: str | Path) -> str:
    """Initialize `work_tree` as a Git repository (branch `main`) holding its files as one baseline commit.

    Args:
        work_tree: directory with the baseline files and no `.git`.

    Returns:
        The 40-hex commit id (the same for the same files on any machine).

    Raises:
        ValueError: `work_tree` already has `.git` or tracks a reserved path.
        subprocess.CalledProcessError / git.GitCommandError: git failed.
    """
    raise NotImplementedError
