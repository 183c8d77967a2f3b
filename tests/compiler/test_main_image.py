"""The compiled `main` image on a real Docker engine: baseline commit and the agent's CLI."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from _support.specs import make_spec_tree

from vero.compiler import compile_task


def _docker(*args: str, timeout_sec: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_sec, check=False)


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_main_image_holds_the_baseline_commit_and_runs_the_cli_as_agent(tmp_path):
    tree = make_spec_tree(tmp_path / "spec")
    result = compile_task(tree.path, tmp_path / "task")
    tag = f"vero-test-compiler-main-{uuid.uuid4().hex[:12]}"
    try:
        built = _docker("build", "-q", "--force-rm", "-t", tag, str(result.layout.environment_dir), timeout_sec=840)
        assert built.returncode == 0, built.stdout + built.stderr
        probe = _docker(
            "run",
            "--rm",
            "--user",
            "agent",
            tag,
            "bash",
            "-c",
            "id -un; cd /app && git rev-parse HEAD && git status --porcelain | wc -l"
            " && git log --format=%an:%ae:%at:%s && stat -c %U .git && vero harbor --help >/dev/null"
            " && echo cli-ok && test -L util-link.py && test -x run.sh && echo files-ok"
            " && test ! -e /opt/vero/cases && test ! -e /opt/vero/config.json && echo no-trusted-files",
            timeout_sec=120,
        )
        assert probe.returncode == 0, probe.stdout + probe.stderr
        lines = probe.stdout.splitlines()
        assert lines[0] == "agent"
        assert lines[1] == result.baseline_commit
        assert lines[2] == "0"  # the checkout is clean: every baseline file is committed
        assert lines[3] == "vero:vero@localhost:0:baseline"
        assert lines[4] == "agent"  # the agent owns its repository
        assert "cli-ok" in lines and "files-ok" in lines
        assert "no-trusted-files" in lines  # no cases and no role config in main
    finally:
        _docker("image", "rm", "-f", tag, timeout_sec=120)


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_main_image_build_fails_when_the_baseline_commit_differs(tmp_path):
    tree = make_spec_tree(tmp_path / "spec")
    result = compile_task(tree.path, tmp_path / "task")
    # A changed baseline file must not reproduce the compiled commit id: the build refuses.
    (result.layout.main.baseline_dir / "prog.py").write_text('print("tampered")\n')
    tag = f"vero-test-compiler-main-{uuid.uuid4().hex[:12]}"
    try:
        built = _docker("build", "-q", "--force-rm", "-t", tag, str(result.layout.environment_dir), timeout_sec=840)
        assert built.returncode != 0
        assert "not the compiled baseline_commit" in built.stdout + built.stderr
    finally:
        _docker("image", "rm", "-f", tag, timeout_sec=120)
