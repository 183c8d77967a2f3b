"""Shared test setup.

Docker-marked tests need a Docker engine (`../shared/ci/docker-up.sh` starts one). Where no engine
answers they are skipped, unless `VERO_REQUIRE_DOCKER=1` (set by `.ci/run`): then they fail, so CI
can never pass by skipping them.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


PROBE_UID = 1001
"""An unprivileged uid the toolchain is checked with (any uid other than root would do)."""


@functools.cache
def docker_available() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


SLOWEST_FIRST = (
    "tests/examples/test_examples.py",
    "tests/e2e/test_examples_e2e.py",
    "tests/failures/test_check_docker.py",
    "tests/e2e/test_hostile_program_e2e.py",
    "tests/e2e/test_candidate_boundary_e2e.py",
    "tests/e2e/test_report_e2e.py",
    "tests/e2e/test_modal_emulated_e2e.py",
    "tests/e2e/test_agent_loop_e2e.py",
    "tests/harbor/test_harbor_backend.py",
    "tests/core/test_ledger.py",
    "tests/e2e/test_growth_script.py",
    "tests/e2e/test_hostile_agent_e2e.py",
    "tests/harbor/test_paired_runs.py",
    "tests/e2e/test_case_route_e2e.py",
)
"""Modules whose tests take minutes (a whole-suite run on 3 workers, `--durations`), longest first.
The README's `pytest -n 3` (with pyproject.toml's `--dist loadfile --no-loadscope-reorder`) hands
whole modules to the workers in collection order, so these go first: started last, one of them
would keep the run waiting on a single worker. (xdist's own order, by number of tests, put a
one-test module of five minutes last.)"""


def _slowest_first(items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    missing = [path for path in SLOWEST_FIRST if not (root / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SLOWEST_FIRST names no such module: {', '.join(missing)}")
    rank = {path: index for index, path in enumerate(SLOWEST_FIRST)}

    def key(item: pytest.Item) -> int:
        try:
            path = item.path.resolve().relative_to(root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: the rest keep their order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slowest_first(items)
    if not any(item.get_closest_marker("docker") for item in items) or docker_available():
        return
    if os.environ.get("VERO_REQUIRE_DOCKER") == "1":
        raise pytest.UsageError("VERO_REQUIRE_DOCKER=1 but no Docker engine answers `docker info`")
    skip = pytest.mark.skip(reason="no Docker engine (run ../shared/ci/docker-up.sh)")
    for item in items:
        if item.get_closest_marker("docker"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def portable_toolchain(tmp_path_factory):
    """`(harbor, python)` executables that any uid can run: for `run_as` tests (uid 1001) and for
    `kind: agent` candidate hosts (throw-away uids).

    The project venv's interpreter lives under `/root` (mode 0700 here), so uid 1001 cannot exec it.
    This builds a hard-linked copy of the interpreter's prefix, a venv on top of it that sees the
    project venv's packages (a `.pth` calling `site.addsitedir`), and two wrapper scripts. Nothing
    of the original is modified (hard links share inodes; only new dirs and files are written).
    """
    if os.geteuid() != 0:
        yield Path(sys.executable).parent / "harbor", Path(sys.executable)
        return
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "pass"], user=PROBE_UID, group=PROBE_UID, capture_output=True
        ).returncode
    except PermissionError:
        probe = -1
    if probe == 0:
        yield Path(sys.executable).parent / "harbor", Path(sys.executable)
        return
    real = Path(sys.executable).resolve()
    prefix = real.parent.parent
    shared_root = Path(tempfile.mkdtemp(prefix="vero-toolchain-"))
    shared_root.chmod(0o755)
    tool = shared_root / "toolchain"
    tool.mkdir()
    subprocess.run(["cp", "-al", str(prefix), str(tool / "py")], check=True)
    lib = tool / "py" / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib)}
    subprocess.run(
        [str(tool / "py" / "bin" / real.name), "-m", "venv", "--without-pip", str(tool / "venv")], check=True, env=env
    )
    project_site = next((Path(sys.prefix) / "lib").glob("python3*/site-packages"))
    venv_site = next((tool / "venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "vero-project-venv.pth").write_text(f"import site; site.addsitedir({str(project_site)!r})\n")
    bin_dir = tool / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexport LD_LIBRARY_PATH="{lib}"\nexec "{tool / "venv" / "bin" / "python"}" "$@"\n')
    harbor = bin_dir / "harbor"
    harbor.write_text(
        f'#!/bin/sh\nexec "{python}" -c "import sys; from harbor.cli.main import app; '
        f'sys.argv[0] = \'harbor\'; sys.exit(app())" "$@"\n'
    )
    for script in (python, harbor):
        script.chmod(0o755)
    check = subprocess.run(
        [str(python), "-c", "import harbor, vero.harbor.install_agent"],
        user=PROBE_UID,
        group=PROBE_UID,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    yield harbor, python
    subprocess.run(["rm", "-rf", str(shared_root)], check=False)
