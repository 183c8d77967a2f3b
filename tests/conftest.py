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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
