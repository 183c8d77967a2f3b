"""The compiled sidecar container leaves no zombie and no candidate process after 1,000
candidate-host lifecycles.

A candidate host's leftovers (a daemon its uid started outside its session) are killed when the
host ends, and as orphans they belong to PID 1 by then. So PID 1 must reap: the compiled compose
file gives `eval-sidecar` an init (`init: true`), and this test runs the compiled sidecar image the
way that file says (`docker run --init` exactly when it asks for one), with the real
`CandidateLauncher` as root inside it (`reaping/lifecycles.py`), each host in its own namespaces
(with `CAP_NET_ADMIN` and `CAP_SYS_ADMIN`, which a `kind: agent` target's compose file gives): they leave no mount
in the container either."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from vero.compiler import compile_task

from ._examples import TASKS_DIR, compose_build, harbor_env, remove_images, secret_env

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

SCRIPT = Path(__file__).resolve().parent / "reaping" / "lifecycles.py"
LIFECYCLES = 1000


def test_a_thousand_candidate_host_lifecycles_leave_nothing_in_the_sidecar(tmp_path: Path) -> None:
    result = compile_task(TASKS_DIR / "minimal" / "build.yaml", tmp_path / "task")
    layout = result.layout
    service = yaml.safe_load(layout.compose_path.read_text())["services"]["eval-sidecar"]
    assert service.get("init") is True, service  # PID 1 of the sidecar reaps
    project = f"vero-e2e-reap-{uuid.uuid4().hex[:8]}"
    image = f"{project}-eval-sidecar"
    try:
        compose_build(layout.compose_path, project, {**harbor_env(), **secret_env("minimal")}, timeout_sec=1200)
        done = subprocess.run(
            [
                "docker", "run", "--rm", *(["--init"] if service.get("init") else []),
                "--cap-add=NET_ADMIN", "--cap-add=SYS_ADMIN",
                "-v", f"{SCRIPT}:/opt/lifecycles.py:ro",
                image, "python", "/opt/lifecycles.py", str(LIFECYCLES),
            ],
            capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
    finally:
        remove_images([image, f"{project}-main"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n[e2e] {report['lifecycles']} candidate-host lifecycles in {report['seconds']} s")
    assert report["lifecycles"] == LIFECYCLES
    assert report["zombies"] == [], report["zombies"][:10]
    assert report["candidate_processes"] == [], report["candidate_processes"][:10]
    assert report["other_processes"] == [], report["other_processes"][:10]
    assert report["mounts"] == [], report["mounts"][:10]
