"""Every file of a compiled task, named once (like Harbor 0.26 `models/task/paths.py` `TaskPaths`).

```
<task>/
├── task.toml                     schema 1.4; loads with Harbor's TaskConfig
├── instruction.md                the agent's brief (no hidden partition is named)
├── environment/                  build context of `main` (Harbor's compose base file points here)
│   ├── .dockerignore             keeps `sidecar/` out of main's build context
│   ├── Dockerfile                main: target checkout at /app (baseline commit), agent CLI, user agent
│   ├── docker-compose.yaml       services main + eval-sidecar, volumes workspace + context
│   ├── baseline/                 the baseline files (become /app)
│   ├── dist/                     vero-<v>-py3-none-any.whl, requirements.txt (the client's pins)
│   ├── skills/<skill>/SKILL.md   the vero skill (-> /opt/vero/skills; task.toml's skills_dir)
│   └── sidecar/                  build context of eval-sidecar (trusted)
│       ├── Dockerfile
│       ├── config.json           SidecarConfig (agent-accessible partitions only)
│       ├── baseline/
│       ├── cases/<case>/         Harbor task dirs of agent-accessible partitions only
│       ├── kit/vero-kit.c        the case kit's source (built in the image, uploaded into cases)
│       └── dist/                 the wheel, requirements.txt (runtime pins + harbor.requirement)
├── tests/                        the separate verifier's image (Harbor bundles tests it builds)
│   ├── Dockerfile
│   ├── docker-compose.yaml       (docker only) service main + the engine socket, read-only
│   ├── config.json               VerifierConfig
│   ├── test.sh                   -> vero harbor verify
│   ├── baseline/
│   ├── cases/<case>/             target partitions and the selection partition
│   ├── kit/vero-kit.c
│   └── dist/
└── solution/
    ├── solve.sh                  the oracle: apply the reference change, evaluate, submit
    └── reference.patch | reference/
```

Host paths are `pathlib.Path`; in-container paths live in `vero.spec.compiled.CONTAINER_PATHS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The unprivileged user baked into the sidecar and verifier images, whom nested `harbor run`s run as.
from vero.harbor.process import RUNNER_USER

__all__ = ["RUNNER_USER", "SIDECAR_SERVICE", "TaskLayout"]

SIDECAR_SERVICE = "eval-sidecar"
"""Compose service name of the trusted sidecar (the agent reaches it at `http://eval-sidecar:8000`)."""


@dataclass(frozen=True)
class _BuildContext:
    """A Docker build context that carries vero: its Dockerfile, wheel dir and baseline copy."""

    root: Path

    @property
    def dockerfile(self) -> Path:
        return self.root / "Dockerfile"

    @property
    def dist_dir(self) -> Path:
        """The vero wheel and the `requirements.txt` the image installs (-> `/opt/vero/dist`)."""
        return self.root / "dist"

    @property
    def requirements_path(self) -> Path:
        """Exactly pinned requirements installed beside the wheel (`pip install --no-deps` wheel)."""
        return self.dist_dir / "requirements.txt"

    @property
    def baseline_dir(self) -> Path:
        """The baseline files (main: copied to `/app`; trusted roles: `/opt/vero/baseline`)."""
        return self.root / "baseline"


@dataclass(frozen=True)
class _TrustedContext(_BuildContext):
    """A trusted role's build context: also its compiled config and its cases."""

    @property
    def config_path(self) -> Path:
        """The role's compiled config (-> `/opt/vero/config.json`)."""
        return self.root / "config.json"

    @property
    def cases_dir(self) -> Path:
        """Harbor task dirs this role may run (-> `/opt/vero/cases`)."""
        return self.root / "cases"

    def case_dir(self, case: str) -> Path:
        return self.cases_dir / case

    @property
    def kit_source_path(self) -> Path:
        """The case kit's C source; the image builds it statically (-> `/opt/vero/kit/vero-kit`)."""
        return self.root / "kit" / "vero-kit.c"


@dataclass(frozen=True)
class TaskLayout:
    """The files of one compiled task rooted at `root` (a host directory).

    Attributes:
        root: the task directory (`harbor run -p <root>`).
    """

    root: Path

    # top level
    @property
    def config_path(self) -> Path:
        """`task.toml` (Harbor `TaskPaths.config_path`)."""
        return self.root / "task.toml"

    @property
    def instruction_path(self) -> Path:
        return self.root / "instruction.md"

    # environment/ (main)
    @property
    def environment_dir(self) -> Path:
        return self.root / "environment"

    @property
    def main(self) -> _BuildContext:
        """main's build context (`environment/`)."""
        return _BuildContext(self.environment_dir)

    @property
    def compose_path(self) -> Path:
        return self.environment_dir / "docker-compose.yaml"

    @property
    def dockerignore_path(self) -> Path:
        return self.environment_dir / ".dockerignore"

    @property
    def skills_dir(self) -> Path:
        """Skills baked into main (-> `CONTAINER_PATHS.skills`, declared as `[environment] skills_dir`)."""
        return self.environment_dir / "skills"

    def skill_path(self, skill: str) -> Path:
        """A skill's `SKILL.md` (Agent Skills layout: one directory per skill, named as the skill)."""
        return self.skills_dir / skill / "SKILL.md"

    # environment/sidecar/
    @property
    def sidecar(self) -> _TrustedContext:
        """eval-sidecar's build context (`environment/sidecar/`)."""
        return _TrustedContext(self.environment_dir / "sidecar")

    # tests/ (separate verifier)
    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def verifier(self) -> _TrustedContext:
        """The separate verifier's build context (`tests/`)."""
        return _TrustedContext(self.tests_dir)

    @property
    def verifier_compose_path(self) -> Path:
        return self.tests_dir / "docker-compose.yaml"

    @property
    def test_path(self) -> Path:
        """`tests/test.sh` (Harbor `TaskPaths.test_path`); baked into the verifier image at `/tests/test.sh`."""
        return self.tests_dir / "test.sh"

    # solution/
    @property
    def solution_dir(self) -> Path:
        return self.root / "solution"

    @property
    def solve_path(self) -> Path:
        return self.solution_dir / "solve.sh"

    @property
    def reference_patch_path(self) -> Path:
        """The reference change as a patch (`git apply` in `/app`)."""
        return self.solution_dir / "reference.patch"

    @property
    def reference_dir(self) -> Path:
        """The reference change as files overlaid onto `/app`."""
        return self.solution_dir / "reference"

    def contexts(self) -> tuple[_BuildContext, ...]:
        """The three build contexts that each carry the wheel and the baseline (main, sidecar, verifier)."""
        return (self.main, self.sidecar, self.verifier)
