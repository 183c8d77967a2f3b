"""Hostile program candidates, end to end on Docker: through a real sidecar, and scored by the verifier
on hidden partitions (needs Docker; run by CI).

A compiled task (a `word_count` program) has two kinds of cases, one of each in the agent-visible
`train` partition and in the hidden target partition:

- `kit-*` cases run candidate code only through the case kit (`vero-kit run`) and write the reward
  with `vero-kit reward`, as docs/cases.md "Writing program cases" says;
- `nokit-*` cases run it as root and write `reward.txt` themselves, as many third-party cases do.
  The build warns about them, and `scoring.reward_range: [0, 1]` is the guard.

Every hostile candidate computes a wrong answer (its honest score is 0) and attacks the measurement:
writing `reward.json` and `reward.txt`, a daemon started by `install_command` or at test time that
keeps rewriting them, reading `/tests/expected.txt`, links planted at the reward paths, a fork bomb,
filling `/logs`. An honest candidate scores 1 on both kinds. Each candidate is evaluated on `train`
through a real sidecar (`create_app` + `HarborBackend` under uvicorn) and measured on the hidden
target by the verifier's own `Scorer`; one of them is then submitted, the session sealed, and the
verifier image run as Harbor runs a separate verifier.

On kit cases every attack ends at the honest score (0), flagged where the kit noticed it. On the
no-kit cases the forged out-of-range values are caught by `reward_range` (flagged
`reward_out_of_range`), and what the kit cannot protect there stays visible: reading `/tests` works.
The no-kit cases cap their processes (`pids_limit`) only so that the fork bomb cannot hurt the shared
test machine.

Issue 22, both in the sidecar's evaluations and in the verifier's scoring, whose nested runs execute
as an unprivileged runner (uid 1001 with the engine socket's group, as `vero-runner` does in the
compiled images):

- `break-collection`, run as root by a no-kit case, leaves a device node, a fifo and a mode-000
  directory in `/logs/verifier`, so Harbor cannot collect the trial's files
  (`DownloadVerifierDirError`). That is after candidate code ran: a dead attempt, charged and
  flagged `verifier_download_failed`, never a refunded (free) re-run;
- a third kind of case, `shadow-*`, runs candidate code through the kit, but its image puts the
  install path's `bin/` first on `PATH` (as images with a project venv do), so a candidate's
  `bin/vero-kit` would run as root when the tests call the kit. The install agent refuses it before
  the tests, whatever the candidate: `kit_shadowed`, refunded, the case quarantined, the cause named;
  the verifier's target over it is unmeasured (its failure value, status `partial`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
import tenacity
from sidecar._server import ServerThread, commit_file, git, wait_for_state  # tests/ is on sys.path

from vero.compiler import compile_task
from vero.core.baseline import commit_baseline
from vero.core.run import RunAs
from vero.harbor import HarborBackend
from vero.harbor.casekit import build_kit
from vero.sidecar.app import create_app
from vero.sidecar.client import JOB_TERMINAL_STATES
from vero.sidecar.paths import SidecarPaths
from vero.sidecar.seal import request_seal
from vero.sidecar.service import SidecarService
from vero.spec.compiled import SidecarConfig, VerifierConfig, load_config
from vero.verifier.scoring import Scorer

from ._verifier import run_verifier_image

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

BASE_IMAGE = "python:3.13-slim"

KIT_TEST = """#!/bin/bash
set -u
work="$(mktemp -d)"
vero-kit run --cwd /opt/candidate --timeout 20 --nproc 64 --memory-mb 1024 --fsize-mb 1 \\
    -- python3 -c 'import sys, textstats; print(textstats.word_count(sys.stdin.read()))' \\
    < /tests/input.txt > "$work/out"
got="$(head -c 100 "$work/out")"
if [ "$got" = "$(cat /tests/expected.txt)" ]; then vero-kit reward 1
else echo "got ${got:-nothing}"; vero-kit reward 0; fi
"""

NOKIT_TEST = """#!/bin/bash
# A case that does not use the kit: the candidate's code runs as root, the test writes reward.txt.
got="$(cd /opt/candidate && timeout 20 \\
       python3 -c 'import sys, textstats; print(textstats.word_count(sys.stdin.read()))' \\
       < /tests/input.txt | head -c 100)"
if [ "$got" = "$(cat /tests/expected.txt)" ]; then r=1; else r=0; fi
echo "got ${got:-nothing}: reward $r"
echo "$r" > /logs/verifier/reward.txt
"""

# case -> (partition, input, expected count, kind: kit, nokit or shadow)
CASES = {
    "kit-train": ("train", "one two three", 3, "kit"),
    "nokit-train": ("train", "red green", 2, "nokit"),
    "kit-hidden": ("hidden", "alpha beta gamma delta", 4, "kit"),
    "nokit-hidden": ("hidden", "x y z w v", 5, "nokit"),
    "shadow-train": ("shadow", "a b", 2, "shadow"),
    "shadow-hidden": ("shadowed", "p q r", 3, "shadow"),
}

SPEC = """\
schema_version: 1
name: hostile-program-e2e
description: Count whitespace-separated words.
target:
  kind: program
  path: target
  install_path: /opt/candidate
  install_command: sh ./install.sh
cases:
  path: cases
  partitions:
    train: [kit-train, nokit-train]
    hidden: [kit-hidden, nokit-hidden]
    shadow: [shadow-train]
    shadowed: [shadow-hidden]
scoring:
  reward_range: [0, 1]
agent_access:
  train:
    disclosure: full
    min_aggregate_cases: 1
    total_runs: 20
    total_cases: 40
  shadow:
    disclosure: full
    min_aggregate_cases: 1
    total_runs: 5
    total_cases: 5
selection:
  mode: submit
  partition: train
targets:
  hidden:
    reward_key: reward
  shadowed:
    reward_key: shadowed
harbor:
  n_concurrent: 2
  case_timeout_sec: 60
  evaluation_timeout_sec: 600
  drain_timeout_sec: 60
  infra_retries: 1
  verifier_timeout_sec: 1800
images:
  main: %(image)s
  sidecar: %(image)s
  verifier: %(image)s
"""

WRONG = """

def word_count(text: str) -> int:
    return -1  # never right: the honest score of this candidate is 0
"""

# name -> (textstats.py, install.sh)
CANDIDATES: dict[str, tuple[str, str]] = {
    "honest": ("def word_count(text: str) -> int:\n    return len(text.split())\n", "true\n"),
    "forge-files": (
        """
for path, text in (("/logs/verifier/reward.json", '{"reward": 1000.0}'), ("/logs/verifier/reward.txt", "1000")):
    try:
        open(path, "w").write(text)
    except OSError:
        pass
"""
        + WRONG,
        "true\n",
    ),
    "install-daemon": (
        WRONG,
        """
( while :; do
    echo '{"reward": 1000.0}' > /logs/verifier/reward.json; echo 1000 > /logs/verifier/reward.txt; sleep 0.1
  done ) >/dev/null 2>&1 &
head -c 8000000 /dev/zero > /logs/agent/fill.bin 2>/dev/null
exit 0
""",
    ),
    # The daemon tells the candidate (through /tmp) once it has tried its first write, so that where
    # it can write, a forged reward is there when the test ends, whatever the machine's load.
    "test-daemon": (
        '''
import os, subprocess, sys, tempfile, time
READY = tempfile.mktemp(prefix="daemon-ready-")
LOOP = """
import os, sys, time
for round in range(600):
    for path, text in (("/logs/verifier/reward.json", '{"reward": 1000.0}'), ("/logs/verifier/reward.txt", "1000")):
        try:  # by rename: Harbor never reads a half-written file (an empty reward is a dead attempt)
            open(path + ".forge", "w").write(text)
            os.replace(path + ".forge", path)
        except OSError:
            pass
    if round == 0:
        open(sys.argv[1], "w").close()
    time.sleep(0.05)
"""
subprocess.Popen([sys.executable, "-c", LOOP, READY], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
for _ in range(600):
    if os.path.exists(READY):
        break
    time.sleep(0.05)
'''
        + WRONG,
        "true\n",
    ),
    "read-tests": (
        """
def word_count(text: str) -> int:
    try:
        return int(open("/tests/expected.txt").read())
    except OSError:
        return -1
""",
        "true\n",
    ),
    "symlink": (
        """
import os
try:
    open("/tmp/forged.json", "w").write('{"reward": 1000.0}')
    os.symlink("/tmp/forged.json", "/logs/verifier/reward.json")
except OSError:
    pass
try:
    os.symlink("/etc/passwd", "/logs/verifier/reward.txt")  # a root test writing reward.txt clobbers it
except OSError:
    pass
"""
        + WRONG,
        "ln -s /etc/passwd /logs/verifier/reward.txt 2>/dev/null; true\n",
    ),
    "fork-bomb": (
        """
import os, time

def word_count(text: str) -> int:
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.fork()
        except OSError:
            time.sleep(0.05)
    return -1
""",
        "true\n",
    ),
    # Run as root by a no-kit case: what Harbor (as an unprivileged runner) cannot download.
    "break-collection": (
        """
import os, stat
for top in ("/logs/verifier", "/logs/artifacts"):
    for make in (
        lambda: os.mknod(top + "/null", stat.S_IFCHR | 0o666, os.makedev(1, 3)),
        lambda: os.mkfifo(top + "/fifo"),
        lambda: (os.makedirs(top + "/locked/inside"), os.chmod(top + "/locked", 0)),
    ):
        try:
            make()
        except OSError:
            pass
"""
        + WRONG,
        "true\n",
    ),
    "fill-logs": (
        """
import sys

def word_count(text: str) -> int:
    chunk = b"x" * (1 << 20)
    for path in ("/logs/verifier/fill.bin", "/logs/agent/fill.bin", "/logs/artifacts/fill.bin", "/tmp/fill.bin"):
        try:
            with open(path, "wb") as out:
                for _ in range(8):
                    out.write(chunk)
        except OSError:
            pass
    try:
        for _ in range(8):
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
    except OSError:
        pass
    return -1
""",
        "head -c 8000000 /dev/zero > /logs/agent/fill.bin 2>/dev/null; true\n",
    ),
}


SHADOW_KIT = """#!/bin/sh
# A candidate's own vero-kit: where the tests would call it as root, it writes the reward.
mkdir -p /logs/verifier && echo '{"reward": 1}' > /logs/verifier/reward.json
"""


def _write_spec(root: Path) -> Path:
    (root / "target").mkdir(parents=True)
    (root / "target" / "textstats.py").write_text(CANDIDATES["honest"][0].replace("text.split()", 'text.split(" ")'))
    (root / "target" / "install.sh").write_text("true\n")
    for name, (_, text, expected, kind) in CASES.items():
        case = root / "cases" / name
        (case / "environment").mkdir(parents=True)
        (case / "tests").mkdir()
        (case / "task.toml").write_text(
            'schema_version = "1.4"\n\n[agent]\ntimeout_sec = 60.0\n\n'
            "[verifier]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 300.0\n"
        )
        # A shadow case's image puts the install path's bin/ first on PATH, as a project venv would.
        path = "ENV PATH=/opt/candidate/bin:$PATH\n" if kind == "shadow" else ""
        (case / "environment" / "Dockerfile").write_text(
            f"FROM {BASE_IMAGE}\nRUN mkdir -p /opt/candidate\nWORKDIR /opt/candidate\n{path}"
        )
        if kind == "nokit":
            # Only to keep the fork bomb (root here) from hurting the shared test machine.
            (case / "environment" / "docker-compose.yaml").write_text("services:\n  main:\n    pids_limit: 256\n")
        (case / "instruction.md").write_text(f"Case {name}.\n")
        (case / "tests" / "input.txt").write_text(text)
        (case / "tests" / "expected.txt").write_text(f"{expected}\n")
        (case / "tests" / "test.sh").write_text(NOKIT_TEST if kind == "nokit" else KIT_TEST)
        os.chmod(case / "tests" / "test.sh", 0o755)
    spec = root / "build.yaml"
    spec.write_text(SPEC % {"image": BASE_IMAGE})
    return spec


def _dir_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture
def workspace():
    root = Path(tempfile.mkdtemp(prefix="vero-e2e-hostile-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_hostile_program_candidates_end_at_or_below_their_honest_score(workspace: Path, portable_toolchain) -> None:
    compiled = compile_task(_write_spec(workspace / "spec"), workspace / "task")
    layout = compiled.layout
    # Nested runs as an unprivileged runner with the socket's group, as in the compiled images.
    harbor, python = portable_toolchain
    (workspace / "kit").mkdir(mode=0o755)
    kit_binary = build_kit(workspace / "kit" / "vero-kit")
    home = workspace / "home-1001"
    home.mkdir()
    os.chown(home, 1001, 1001)
    run_as = RunAs(uid=1001, gid=1001, extra_groups=(os.stat("/var/run/docker.sock").st_gid,), home=home)

    def backend() -> HarborBackend:
        return HarborBackend(
            harbor_executable=harbor, python_executable=python, case_kit=kit_binary, infra_wait=tenacity.wait_none()
        )

    # The build names every no-kit case, and only those (beside the missing reference's warning).
    kit = [w for w in compiled.warnings if "vero-kit" in w]
    assert sorted(w.split("'")[1] for w in kit) == ["nokit-hidden", "nokit-train"]
    assert [w for w in compiled.warnings if w not in kit] == [
        w for w in compiled.warnings if w.startswith("target.reference is not set")
    ]

    agent_repo = workspace / "app"
    shutil.copytree(layout.main.baseline_dir, agent_repo)
    assert commit_baseline(agent_repo) == compiled.baseline_commit
    commits = {}
    for name, (source, install) in CANDIDATES.items():
        git(agent_repo, "checkout", "-q", compiled.baseline_commit)
        (agent_repo / "install.sh").write_text(install)
        commits[name] = commit_file(agent_repo, "textstats.py", source, name)
    git(agent_repo, "checkout", "-q", compiled.baseline_commit)
    (agent_repo / "bin").mkdir()
    (agent_repo / "bin" / "vero-kit").write_text(SHADOW_KIT)
    (agent_repo / "bin" / "vero-kit").chmod(0o755)
    shadow_kit = commit_file(agent_repo, "textstats.py", WRONG, "a vero-kit of its own")

    # -- through the sidecar: every candidate on train (one kit and one no-kit case) ---------------
    config = load_config(layout.sidecar.config_path, SidecarConfig)
    state_dir, export_dir = workspace / "state", workspace / "export"
    paths = SidecarPaths(
        state_dir=state_dir,
        agent_repo=agent_repo,
        context_dir=workspace / "context",
        cases_dir=layout.sidecar.cases_dir,
        baseline_dir=layout.sidecar.baseline_dir,
        work_dir=workspace / "work",
    )
    app = create_app(SidecarService(config, paths, backend(), run_as=run_as))
    train: dict[str, dict[str, dict]] = {}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
        jobs = {}
        for name, commit in commits.items():
            response = client.post("/evaluations", json={"partition": "train", "version": commit})
            assert response.status_code == 202, response.text
            jobs[name] = response.json()["id"]
        for name, job_id in jobs.items():
            job = wait_for_state(client, job_id, JOB_TERMINAL_STATES, timeout_sec=1200)
            assert job.get("state") == "complete", (name, job)
            train[name] = {c["case"]: c for c in job["result"]["cases"]}
        # The shadow case is refused whatever the candidate: the honest one's evaluation fails with
        # the case problem (refunded), and the case is quarantined: the next request is refused at
        # admission, before anything is charged or run.
        shadowed = client.post("/evaluations", json={"partition": "shadow", "version": commits["honest"]})
        assert shadowed.status_code == 202, shadowed.text
        shadowed_id = shadowed.json()["id"]
        problem = wait_for_state(client, shadowed_id, JOB_TERMINAL_STATES, timeout_sec=600)
        assert problem["code"] == "kit_shadowed" and problem["cases"] == ["shadow-train"], problem
        refused = client.post("/evaluations", json={"partition": "shadow", "version": shadow_kit})
        assert refused.status_code == 502 and refused.json()["code"] == "kit_shadowed", refused.text
        shadow_status = next(p for p in client.get("/status").json()["partitions"] if p["name"] == "shadow")
        assert shadow_status["budget"]["remaining_runs"] == 5, shadow_status  # refunded, nothing charged
        submitted = client.post("/submissions", json={"version": commits["test-daemon"]})
        assert submitted.status_code == 201, submitted.text
        sealed = request_seal(export_dir, token_file=state_dir / "admin-token", base_url=server.url, timeout_sec=120)
        records = {job.id: job for job in app.state.service.jobs.list()}

    def attempt(name: str, case: str) -> dict:
        (only,) = train[name][case]["attempts"]
        return only

    kit_train = {name: train[name]["kit-train"]["score"] for name in CANDIDATES}
    assert kit_train == {name: 1.0 if name == "honest" else 0.0 for name in CANDIDATES}, train
    # The kit case gives every hostile candidate its honest 0 as a plain scored measurement...
    for name in CANDIDATES:
        assert attempt(name, "kit-train")["outcome"] == "scored", (name, train[name])
    # ... and on the no-kit case, forged values outside [0, 1] are invalid attempts, flagged (a forged
    # reward.txt is simply overwritten by the test; the install-time daemon was killed by the sandbox).
    nokit_train = {
        name: (train[name]["nokit-train"]["score"], attempt(name, "nokit-train")["outcome"]) for name in CANDIDATES
    }
    assert nokit_train["forge-files"] == (0.0, "reward_out_of_range")
    assert nokit_train["test-daemon"] == (0.0, "reward_out_of_range")
    assert nokit_train["honest"] == (1.0, "scored")
    assert nokit_train["read-tests"] == (1.0, "scored")  # the gap the kit closes: answers are readable
    for name in ("install-daemon", "symlink", "fork-bomb", "fill-logs"):
        assert nokit_train[name][0] == 0.0, (name, nokit_train[name])
    # Harbor could not collect the verifier dir of break-collection's no-kit trial: charged, flagged.
    assert nokit_train["break-collection"] == (0.0, "dead"), train["break-collection"]
    assert attempt("break-collection", "nokit-train")["exception_type"] == "DownloadVerifierDirError"
    # What the kit noticed is kept with the trusted result (flags are not disclosed).
    flags = {
        name: {
            a.outcome: a.flags for c in records[jobs[name]].result.cases if c.case == "kit-train" for a in c.attempts
        }
        for name in CANDIDATES
    }
    assert "leftover_processes_killed" in flags["test-daemon"]["scored"], flags["test-daemon"]
    assert "install_leftover_processes_killed" in flags["install-daemon"]["scored"], flags["install-daemon"]
    (broken,) = [
        a for c in records[jobs["break-collection"]].result.cases if c.case == "nokit-train" for a in c.attempts
    ]
    assert broken.outcome == "dead" and "verifier_download_failed" in broken.flags, broken
    shadow_record = records[shadowed_id]
    (problem,) = shadow_record.diagnostics.problems
    assert (problem.case, problem.code) == ("shadow-train", "kit_shadowed")
    assert "PATH entry /opt/candidate/bin is in the candidate's tree" in problem.detail, problem.detail
    # Filling /logs got nowhere in the kit case: its trial dirs stay small.
    fill_job = Path(records[jobs["fill-logs"]].result.job_dir)
    (kit_trial,) = [p for p in fill_job.iterdir() if p.is_dir() and p.name.startswith("kit-train")]
    assert _dir_bytes(kit_trial) < 1024 * 1024, _dir_bytes(kit_trial)

    # -- the verifier's own scoring of every candidate on the hidden target (one kit, one no-kit case) --
    verifier_config = load_config(layout.verifier.config_path, VerifierConfig)
    assert verifier_config.build_warnings == list(compiled.warnings)

    def checkout(candidate: str, dest: Path) -> Path:
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(agent_repo), "archive", candidate], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return dest

    scorer = Scorer(
        backend=backend(),
        config=verifier_config,
        checkout=checkout,
        cases_dir=layout.verifier.cases_dir,
        work_dir=workspace / "verify",
        run_as=run_as,
    )
    slots = asyncio.Semaphore(2)

    async def measure(name: str):
        async with slots:
            return await scorer.measure(commits[name], "hidden", "target")

    async def everything():
        found = await asyncio.gather(
            *(measure(n) for n in CANDIDATES), scorer.measure(shadow_kit, "shadowed", "target")
        )
        return dict(zip(CANDIDATES, found[:-1], strict=True)), found[-1]

    hidden, shadow_measurement = asyncio.run(everything())
    # The shadowed target is not measured at all: a case problem, named, whatever the candidate.
    assert not shadow_measurement.measured and "kit_shadowed" in (shadow_measurement.error or ""), shadow_measurement
    for name, measurement in hidden.items():
        assert measurement.measured, (name, measurement.error)
    # Mean of the two cases: 1 for the honest candidate, 0 for every attack but reading the no-kit
    # case's answers (0.5); the forged values are flagged.
    assert {n: m.score for n, m in hidden.items()} == {
        name: {"honest": 1.0, "read-tests": 0.5}.get(name, 0.0) for name in CANDIDATES
    }, hidden
    assert hidden["forge-files"].flags.get("reward_out_of_range") == 1
    assert hidden["test-daemon"].flags.get("reward_out_of_range") == 1
    assert hidden["test-daemon"].flags.get("leftover_processes_killed") == 1
    assert (
        hidden["break-collection"].n_dead == 1 and hidden["break-collection"].flags.get("verifier_download_failed") == 1
    )

    # -- the verifier container on the sealed session (the daemon candidate was submitted) ---------
    logs = workspace / "logs-verifier"
    logs.mkdir()
    verified = run_verifier_image(layout, export_dir, logs, name="vero-test-e2e-hostile")
    assert verified.returncode == 16, verified.diagnostics  # `partial` (vero.commands.exit_codes)
    assert verified.reward == {"reward": 0.0, "shadowed": 0.0}, verified.diagnostics
    final = verified.finalization
    # The shadowed target is at its failure value, its case problem named: partial, never scored.
    assert final["status"] == "partial" and final["session_sha256"] == sealed.sha256, final["status"]
    assert final["chosen"]["candidate"] == commits["test-daemon"]
    targets = {t["partition"]: t for t in final["targets"]}
    target = targets["hidden"]
    assert target["flags"].get("reward_out_of_range") == 1 and target["flags"].get("leftover_processes_killed") == 1
    assert [(p["case"], p["code"]) for p in final["problems"]] == [("shadow-hidden", "kit_shadowed")]
    assert "vero-runner" in final["run_as"]
    assert sum(w.startswith("build: case 'nokit-") for w in final["warnings"]) == 2, final["warnings"]
    assert any(
        w.startswith("target hidden: 1 attempt(s) reported a reward outside scoring.reward_range")
        for w in final["warnings"]
    ), final["warnings"]
