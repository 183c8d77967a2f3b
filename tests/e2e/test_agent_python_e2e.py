"""`target.python` in a compiled sidecar image, on Docker: the image carries the interpreter the spec
asks for, and a candidate host runs on it with the candidate's declared dependencies.

The local base images hold Python 3.13 only (Debian 13's), and no interpreter can be downloaded
here, so this builds a base image as an operator's `python:3.12-slim` with Debian's 3.13 would be:
`vero-base:trixie` plus a second CPython (3.12, this machine's own build, its shared library where
the loader finds it). `tasks/puzzle-agent` (its `pyproject.toml` declares `humanize`) is compiled
with `target.python: "3.12"` and that base image; its baseline asserts at import that it runs on
3.12. Only the sidecar image is built (the verifier's comes from the same template include); in it,
the production path runs as the sidecar runs it: `HarborBackend.host_python`, the dependency
install, a `CandidateLauncher` host and the import pre-flight.

Both images are built by BuildKit (`_examples.build_image`), whose layer cache outlives the removed
tags: on a warm engine only the layers from the vero wheel on are rebuilt (measured on the shared
two-core machine: 131 s cold with the new layers, 19 s warm).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from vero.compiler import compile_task

from ._examples import TASKS_DIR, build_image, harbor_env, remove_images

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

SECOND_VERSION = "3.12"

IN_IMAGE = """
import asyncio, json, sys
from pathlib import Path
from vero.core.run import NestedRun
from vero.harbor import HarborBackend
from vero.harbor.boundary import CandidateLauncher
from vero.harbor.boundary.preflight import preflight_in_host
from vero.spec.models import CandidateRuntime, HarborSpec, ScoringSpec

config = json.loads(Path("/opt/vero/config.json").read_text())
runtime = CandidateRuntime.model_validate(config["runtime"])
run = NestedRun(
    evaluation_id="ev-python", partition="train", candidate="0" * 40,
    candidate_dir=Path("/opt/vero/baseline"), cases_dir=Path("/opt/vero/cases"), case_names=("c",),
    jobs_dir=Path("/var/tmp/jobs"), runtime=runtime, harbor=HarborSpec(), scoring=ScoringSpec(),
)

async def main():
    backend = HarborBackend()
    out = {"asked": runtime.python, "default": str(backend.host_python(None))}
    python = backend.host_python(runtime.python)
    out["host_python"] = str(python)
    sites = backend.candidate_sites()
    out["version"] = sites.python_version(python)
    for round in ("first", "second"):
        site = await sites.site_for(run.candidate_dir, python)
        out[round] = {"reused": site.reused, "install_sec": site.install_sec, "path": str(site.path)}
        async with CandidateLauncher(python) as launcher:
            launcher.site_dir = site.path
            failure = await preflight_in_host(launcher, run)
        out[round]["preflight"] = None if failure is None else [failure.exception_type, failure.message]
    async with CandidateLauncher(backend.host_python(None)) as launcher:
        launcher.site_dir = site.path
        failure = await preflight_in_host(launcher, run)
    out["on_default"] = None if failure is None else [failure.exception_type, failure.message]
    print("RESULT " + json.dumps(out))

asyncio.run(main())
"""


def _second_cpython() -> Path:
    """This machine's CPython 3.12 prefix (pyenv's: docs/architecture.md "Running and testing here")."""
    found = sorted(Path("/root/.pyenv/versions").glob(f"{SECOND_VERSION}.*"))
    found = [p for p in found if (p / "bin" / f"python{SECOND_VERSION}").is_file()]
    assert found, f"no CPython {SECOND_VERSION} under /root/.pyenv/versions on this machine"
    return found[-1]


def _run(command: list[str], timeout_sec: float, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_sec, check=False, **kwargs)
    assert done.returncode == 0, f"{' '.join(command[:4])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def two_python_base(tmp_path_factory) -> str:
    """A base image with Debian's Python 3.13 and a CPython 3.12 as `python3.12` on PATH."""
    context = tmp_path_factory.mktemp("two-python-base")
    prefix = _second_cpython()
    shutil.copytree(
        prefix,
        context / "cpython",
        symlinks=True,
        ignore=shutil.ignore_patterns(
            "test", "site-packages", "__pycache__", "*.a", "idlelib", "tkinter", "turtledemo"
        ),
    )
    # Laid out as python:3.12-slim has it (prefix /usr/local), so the interpreter finds its stdlib.
    (context / "Dockerfile").write_text(
        "FROM vero-base:trixie\n"
        "COPY cpython/lib/python3.12 /usr/local/lib/python3.12\n"
        "COPY cpython/lib/libpython3.12.so.1.0 /usr/local/lib/\n"
        "COPY cpython/bin/python3.12 /usr/local/bin/\n"
        "RUN ldconfig && python3.12 -c 'import ssl, sqlite3, ctypes, zlib, sys; print(sys.prefix)' \\\n"
        "    && python3 --version\n"
    )
    tag = f"vero-test-two-python:{uuid.uuid4().hex[:12]}"
    build_image(context, tag, harbor_env(), 600)
    yield tag
    remove_images([tag])


def test_target_python_runs_the_candidate_host_on_the_asked_version(two_python_base, tmp_path):
    example = tmp_path / "puzzle-agent"
    shutil.copytree(TASKS_DIR / "puzzle-agent", example)
    package = example / "target" / "puzzle_agent" / "__init__.py"
    package.write_text(
        "import sys\n\n"
        f"assert sys.version_info[:2] == {tuple(int(x) for x in SECOND_VERSION.split('.'))}, sys.version\n"
        + package.read_text()
    )
    spec_path = example / "build.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["target"]["python"] = SECOND_VERSION
    spec["images"] = {"main": two_python_base, "sidecar": two_python_base, "verifier": two_python_base}
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    compiled = compile_task(spec_path, tmp_path / "task")
    sidecar_context = compiled.task_dir / "environment" / "sidecar"
    dockerfile = (sidecar_context / "Dockerfile").read_text()
    assert f"/opt/vero/python/{SECOND_VERSION}" in dockerfile
    tag = f"vero-test-python-sidecar:{uuid.uuid4().hex[:12]}"
    try:
        build_image(sidecar_context, tag, harbor_env(), 900)
        done = _run(["docker", "run", "--rm", tag, "python", "-I", "-c", IN_IMAGE], 600)
    finally:
        remove_images([tag])
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    print(f"\n[python] {out}")
    assert out["asked"] == SECOND_VERSION
    assert out["host_python"] == f"/opt/vero/python/{SECOND_VERSION}/bin/python"
    assert out["version"].startswith(f"{SECOND_VERSION}.") and out["default"] == "/opt/vero/venv/bin/python"
    assert out["first"]["preflight"] is None, out  # imported on 3.12, with humanize installed for it
    assert out["first"]["reused"] is False and out["second"]["reused"] is True
    assert out["second"]["path"] == out["first"]["path"] and out["second"]["preflight"] is None
    # The same baseline on the image's default interpreter fails its own version check.
    assert out["on_default"] is not None and out["on_default"][0] == "AssertionError"
