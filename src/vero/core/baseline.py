"""The deterministic baseline commit (docs/operating.md, "The compiled task").

The compiler, the `main` image build, the sidecar and the verifier each rebuild the baseline commit
from the same files and must get the same commit id. Everything that feeds the id is fixed:
author and committer `vero <vero@localhost>`, dates `1970-01-01T00:00:00+0000` (epoch 0), message
`baseline\n`, no parent, every file added (`git add -A -f`, ignoring `.gitignore`), no
`core.autocrlf`, file modes as on disk (0644 or 0755; symlinks as links).

A commit id is the hash of the commit object, which holds only the tree id, the (absent) parents,
the author and committer lines and the message; the tree id depends only on names, the three
modes git records (100644, 100755, 120000) and contents. Mtimes, owners, group/other permission
bits and the umask never enter it. What could still vary from machine to machine is the
configuration git reads, so none is read: no system or user config, no system attributes
(`vero.core.isolated_git`), and `core.autocrlf=false`. A `.gitattributes` among the files does apply, but
it is part of the files, so the same files still give the same id.

The same commit from a shell (what a Dockerfile can run; `BASELINE_GIT_ENV` exported, no user or
system git config, git >= 2.30):

```
git init -q -b main . && git add -A -f && git commit -q --no-verify -m baseline
```
"""

from __future__ import annotations

import os
from pathlib import Path

from vero.core.candidates import RESERVED_PATHS
from vero.core.isolated_git import IsolatedGit, private_git_env

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


def _nested_git_entries(root: Path) -> list[str]:
    """Relative paths of `.git` entries below the top level (git would store them as gitlinks)."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):  # never follows symlinks
        for name in (*dirnames, *filenames):
            if name == ".git":
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
        dirnames[:] = [d for d in dirnames if d != ".git"]
    return sorted(found)


def commit_baseline(work_tree: str | Path) -> str:
    """Initialize `work_tree` as a Git repository (branch `main`) holding its files as one baseline commit.

    Args:
        work_tree: directory with the baseline files and no `.git`.

    Returns:
        The 40-hex commit id (the same for the same files on any machine).

    Raises:
        ValueError: `work_tree` is not a directory, already has `.git`, tracks a reserved path
            (`.vero` at the top level), or holds a nested `.git` (git would record an empty gitlink
            instead of the files).
        GitFailed: git failed.
    """
    root = Path(os.path.abspath(work_tree))
    if not root.is_dir():
        raise ValueError(f"baseline work tree {root} is not a directory")
    if os.path.lexists(root / ".git"):
        raise ValueError(f"baseline work tree {root} already has .git")
    for reserved in RESERVED_PATHS:
        if os.path.lexists(root / reserved):
            raise ValueError(f"baseline work tree {root} contains the reserved path {reserved}")
    nested = _nested_git_entries(root)
    if nested:
        raise ValueError(f"baseline work tree {root} contains nested Git data: {', '.join(nested[:5])}")

    # The files may belong to another user than the one committing (image builds, uid 1001).
    with private_git_env(safe_directories=[root, root / ".git"], extra=BASELINE_GIT_ENV) as (env, template):
        repo = IsolatedGit(root, env=env)
        repo.init("-q", f"--template={template}", "--initial-branch=main", "--object-format=sha1", str(root))
        repo.add("-A", "-f", "--", ".")
        tree = repo.write_tree()
        commit = repo.commit_tree("--no-gpg-sign", "-m", BASELINE_MESSAGE, tree)
        # Create `main` only if nothing else did (the old value "" means "must not exist").
        repo.update_ref("-m", "baseline", "refs/heads/main", commit, "")
        return commit
