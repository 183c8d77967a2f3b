"""`vero harbor check` on a spec whose cases have every problem of issue 11 (Docker).

One spec, one check with `--probe`: `same` (rewards 1 whatever the candidate), `no-tests`
(case_invalid), `needs-key` (missing_variables), `tpu` (setup_rejected), `multi-key`
(reward_key_missing, keys found listed), `no-reward` (no_reward), `peek` (reads the candidate as
root: forgeable). No case calls the case kit (kit_missing on every case that runs). The reference
beats the baseline nowhere (reference_not_better). Cases with a problem Harbor's own checks find are
never run; the others run once per candidate and once under the probe, concurrently. The examples'
checks (exit 0, their tables, the probe held) are in `tests/examples/test_examples.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from failure_cases import UNSET_KEY, write_spec

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

VERO = str(Path(sys.executable).with_name("vero"))
EXIT_CHECK_PROBLEMS = 18


def run_check(spec: Path, *args: str, timeout_sec: float = 800) -> subprocess.CompletedProcess[str]:
    from failure_cases import without

    env = {**without((UNSET_KEY,)), "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [VERO, "harbor", "check", "-c", str(spec), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_sec,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_check_names_every_problem_and_exits_non_zero(tmp_path):
    spec = write_spec(
        tmp_path / "spec",
        {"train": ["same"], "hidden": ["no-tests", "needs-key", "tpu", "multi-key", "no-reward", "peek"]},
        targets=["hidden"],
    )
    done = run_check(spec, "--json", "--probe", "--concurrency", "6", "--work-dir", str(tmp_path / "work"))
    assert done.returncode == EXIT_CHECK_PROBLEMS, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["probed"] is True
    rows = {row["case"]: row for row in report["cases"]}
    codes = {case: sorted(p["code"] for p in row["problems"]) for case, row in rows.items()}
    # multi-key's probe run races the test's own reward.json (a case problem, or forgeable): not compared.
    assert {"kit_missing", "reward_key_missing"} <= set(codes.pop("multi-key"))
    assert codes == {
        "same": ["kit_missing", "probe_not_exercised"],
        "no-tests": ["case_invalid"],
        "needs-key": ["missing_variables"],
        "tpu": ["setup_rejected"],
        "no-reward": ["kit_missing", "no_reward", "probe_not_exercised"],
        "peek": ["forgeable", "kit_missing"],
    }
    assert [p["code"] for p in report["problems"]] == ["reference_not_better"]
    # Harbor's checks stop a case before any run; the others ran with both candidates.
    for case in ("no-tests", "needs-key", "tpu"):
        assert rows[case]["baseline"] is None and rows[case]["reference"] is None and rows[case]["probe"] is None
    assert rows["same"]["baseline"]["reward"] == 1 and rows["same"]["reference"]["reward"] == 1
    assert rows["same"]["partition"] == "train" and rows["tpu"]["partition"] == "hidden"
    detail = {case: " ".join(p["detail"] for p in row["problems"]) for case, row in rows.items()}
    assert UNSET_KEY in detail["needs-key"] and "[environment.env]" in detail["needs-key"]
    assert "tests/test.sh" in detail["no-tests"]
    assert "correctness" in detail["multi-key"] and "performance" in detail["multi-key"]
    for run in (rows["multi-key"]["baseline"], rows["multi-key"]["reference"]):
        assert run["reward"] is None and run["outcome"] == "reward_key_missing"
    # The probe: planted when peek's test read the candidate as root, it wrote the reward (the trial's
    # reward is the probe's) and read /tests; same and no-reward never open the candidate.
    peek = rows["peek"]["probe"]
    assert peek["verdict"] == "forgeable" and peek["attempted"], peek
    assert {"wrote /logs/verifier/reward.json or reward.txt", "read a file of /tests"} <= set(peek["findings"])
    assert rows["same"]["probe"]["verdict"] == rows["no-reward"]["probe"]["verdict"] == "not_exercised"
