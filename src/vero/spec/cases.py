"""Find the cases (inner Harbor tasks) a spec's `cases` section names.

A local folder contributes each immediate subdirectory that holds a `task.toml` (Harbor's rule for
`-p DIR`; the case name is the directory name). A registry dataset `name@version` is looked up in
a JSON registry file in Harbor's format (`[{name, version, description, tasks: [{name, path,
git_url?, git_commit_id?}]}]`, Harbor 0.26 `models/registry.py`). Relative task paths in the
registry resolve against the registry file's directory (Harbor itself uses the process cwd; a
compiler must not depend on where it was started).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from vero.errors import SpecError
from vero.spec.models import CasesSpec

__all__ = ["CaseSource", "discover_cases", "read_partition_file"]


@dataclass(frozen=True)
class CaseSource:
    """Where one case's Harbor task directory comes from.

    Attributes:
        name: case name (the task directory name in compiled output).
        path: local task directory, or the path inside `git_url` for a git task.
        git_url: repository of a registry git task (needs network at build time).
        git_commit_id: pinned commit of `git_url`.
    """

    name: str
    path: Path
    git_url: str | None = None
    git_commit_id: str | None = None


def discover_cases(cases: CasesSpec) -> dict[str, CaseSource]:
    """Return case name -> source for every case the `cases` section provides.

    Raises:
        SpecError: the folder or registry is missing or malformed, the dataset or version is unknown.
    """
    if cases.path is not None:
        if not cases.path.is_dir():
            raise SpecError.at("cases.path", f"expected a directory of Harbor task dirs: {cases.path}")
        return {
            child.name: CaseSource(child.name, child)
            for child in sorted(cases.path.iterdir())
            if child.is_dir() and (child / "task.toml").is_file()
        }
    assert cases.dataset is not None and cases.registry_path is not None
    name, _, version = cases.dataset.partition("@")
    try:
        rows = json.loads(cases.registry_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError.at("cases.registry_path", f"registry file not found: {cases.registry_path}") from None
    except (OSError, ValueError):
        raise SpecError.at("cases.registry_path", "expected a JSON registry (a list of datasets)") from None
    from vero.harbor.catalog import registry_datasets  # Harbor is heavy: only for registry datasets

    try:
        datasets = registry_datasets(rows)
    except (ValidationError, TypeError):
        raise SpecError.at("cases.registry_path", "expected Harbor's JSON registry format") from None
    for dataset in datasets:
        if dataset.name == name and dataset.version == version:
            base = cases.registry_path.parent
            return {
                task.name: CaseSource(
                    task.name,
                    task.path if task.git_url else (base / task.path).resolve(),
                    task.git_url,
                    task.git_commit_id,
                )
                for task in dataset.tasks
            }
    raise SpecError.at("cases.dataset", f"dataset {name}@{version} is not in {cases.registry_path}")


def read_partition_file(path: Path) -> list[str]:
    """Case names in a partition file: one per line, blank lines and `#` comments ignored.

    Raises:
        OSError: the file cannot be read.
    """
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names
