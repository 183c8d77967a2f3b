"""Situations 4-6 of issue 11 and finding 4 of issue 27 end to end on Docker, with the real
`vero harbor run` and `--agent oracle`.

The spec leaves `scoring.reward_key` at `reward` while the multi-key cases write
`{"correctness": ..., "performance": ...}`, has no `target.reference`, and a second target whose one
case, `locked-out`, no candidate can be installed in (the candidate user cannot write where
`install_command` writes; its tests would reward whatever the image holds):

- the build warns that the oracle submits the baseline (situation 5);
- the oracle's evaluation through the real sidecar fails as `reward_key_missing` (refunded, the case
  quarantined, the cause on the job record in the sealed session), never a score;
- the verifier scores no target (the case problem, with the keys found, in `finalization.json`
  and on `experiment.html`), the reward is the failure value, never a measured 0 (situation 4);
- the second target is unmeasured too, with the install's own words as its cause: the baseline's
  install failed, so the case is broken (`install_failed`), never a score of 0;
- `vero harbor run` exits 17 (status `failed`) and prints both causes (situation 6).

One run (about as long as `tasks/minimal`'s); every image it builds comes from the layer cache the
other Docker tests fill.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from failure_cases import write_spec

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

VERO = str(Path(sys.executable).with_name("vero"))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("run-e2e")
    spec = write_spec(
        root / "spec",
        {"train": ["multi-key@2"], "hidden": ["multi-key"], "installs": ["locked-out"]},
        targets=["hidden", "installs"],
        reference=False,
    )
    env = {**os.environ, "TMPDIR": str(root), "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [
            VERO,
            "harbor",
            "run",
            "--config",
            str(spec),
            "--agent",
            "oracle",
            "--jobs-dir",
            str(root / "jobs"),
            "--job-name",
            "issue11",
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1400,
        stdin=subprocess.DEVNULL,
    )
    trials = sorted((root / "jobs" / "issue11").glob("*/result.json"))
    assert len(trials) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return {"done": done, "trial": trials[0].parent, "root": root}


def test_vero_harbor_run_exits_17_and_prints_the_cause(run):
    done = run["done"]
    output = done.stdout + done.stderr
    assert done.returncode == 17, output[-4000:]
    assert "warning: target.reference is not set: the oracle" in done.stderr
    assert "cause: case 'multi-key': reward_key_missing:" in done.stderr
    assert "correctness, performance" in done.stderr and "'reward'" in done.stderr
    assert "cause: case 'locked-out': install_failed: vero's install agent cannot install the baseline" in done.stderr
    assert "/opt/report/built.txt: Permission denied" in done.stderr
    assert "verifier status" in done.stdout and "failed" in done.stdout


def test_the_target_is_unmeasured_never_a_zero_score(run):
    artifacts = run["trial"] / "verifier" / "artifacts"
    final = json.loads((artifacts / "finalization.json").read_text())
    assert final["status"] == "failed"
    assert final["chosen"]["is_baseline"] is True  # no reference: the oracle submitted the baseline
    targets = {t["partition"]: t for t in final["targets"]}
    assert sorted(targets) == ["hidden", "installs"]
    for target in targets.values():
        assert target["measured"] is False and target["score"] is None
    assert targets["hidden"]["error"].startswith("CaseMisconfigured (reward_key_missing)")
    assert targets["installs"]["error"].startswith("CaseMisconfigured (install_failed)")
    problems = {p["case"]: p for p in final["problems"]}
    assert {case: p["code"] for case, p in problems.items()} == {
        "multi-key": "reward_key_missing",
        "locked-out": "install_failed",
    }
    assert "correctness, performance" in problems["multi-key"]["detail"]
    assert "/opt/report/built.txt: Permission denied" in problems["locked-out"]["detail"]
    assert any(w.startswith("build: target.reference is not set") for w in final["warnings"])
    measurement = next(m for m in final["measurements"] if m["purpose"] == "target" and m["partition"] == "hidden")
    failures = measurement["diagnostics"]["trial_failures"]
    assert failures and failures[0]["outcome"] == "reward_key_missing"
    assert failures[0]["reward_keys"] == ["correctness", "performance"]
    html = (artifacts / "experiment.html").read_text()
    assert "Failures and their causes" in html and "reward_key_missing" in html and "install_failed" in html
    # The baseline's own trial was the witness: install_failed (its tests' reward of 1 never counted).
    installs = next(m for m in final["measurements"] if m["purpose"] == "target" and m["partition"] == "installs")
    (failure,) = installs["diagnostics"]["trial_failures"]
    assert (failure["outcome"], failure["exception_type"]) == ("install_failed", "CandidateInstallError")


def test_the_sidecar_refunded_the_oracles_evaluation_and_kept_its_cause(run):
    artifacts = run["trial"] / "verifier" / "artifacts"
    status = json.loads((artifacts / "status.json").read_text())
    (budget,) = status["budgets"]
    assert budget["spent_runs"] == 0 and budget["spent_cases"] == 0  # refunded, nothing charged
    with tarfile.open(artifacts / "session.tar.gz") as archive:
        member = next(m for m in archive.getmembers() if Path(m.name).name == "state.json")
        state = json.loads(archive.extractfile(member).read())
    (job,) = state["jobs"]
    assert (job["state"], job["error"]) == ("failed", "reward_key_missing")
    assert job["diagnostics"]["problems"][0]["case"] == "multi-key-2"
    assert job["diagnostics"]["trial_failures"][0]["reward_keys"] == ["correctness", "performance"]
