"""`vero harbor verify` end to end through the CLI, with the real `HarborBackend`."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from _support.cases import write_case
from typer.testing import CliRunner
from verifier_bench import Workbench

from vero.cli import app
from vero.spec.models import HarborSpec

pytestmark = pytest.mark.timeout(300)


def invoke(bench: Workbench, config_path: Path, archive: Path, *extra: str):
    out = bench.root / "cli"
    args = [
        "harbor",
        "verify",
        "--config",
        str(config_path),
        "--session",
        str(archive),
        "--cases-dir",
        str(bench.cases_dir),
        "--baseline-dir",
        str(bench.baseline_files),
        "--reward-path",
        str(out / "verifier" / "reward.json"),
        "--artifacts-dir",
        str(out / "verifier" / "artifacts"),
        "--mirror-dir",
        str(out / "artifacts"),
        "--work-dir",
        str(out / "work"),
        *extra,
    ]
    return CliRunner().invoke(app, args), out


def write_config(bench: Workbench, **kwargs) -> Path:
    config = bench.config(**kwargs).model_copy(update={"harbor": HarborSpec(infra_retries=0)})
    path = bench.root / "config.json"
    path.write_text(config.model_dump_json(indent=2))
    return path


def test_verify_command_refuses_a_tampered_session(bench: Workbench) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    archive = bench.seal()
    data = bytearray(archive.read_bytes())
    data[-40] ^= 0xFF
    archive.write_bytes(bytes(data))

    result, out = invoke(bench, write_config(bench, direction="minimize", failure_value=1e6), archive)

    assert result.exit_code == 10, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "refused" and summary["rewards"] == {"reward": 1e6}
    assert json.loads((out / "verifier" / "reward.json").read_text()) == {"reward": 1e6}
    for directory in (out / "verifier" / "artifacts", out / "artifacts"):
        assert json.loads((directory / "finalization.json").read_text())["status"] == "refused"
        assert (directory / "session.tar.gz").read_bytes() == archive.read_bytes()


def test_verify_command_gives_failure_values_when_the_real_backend_measures_nothing(bench: Workbench) -> None:
    """The cases here are not valid Harbor tasks (no instruction.md): the real backend refuses them
    as misconfigured before running Harbor, the submission gets the failure value instead of a
    score, and the finalization names each case and Harbor's reason."""
    a = bench.candidate("a\n")
    bench.submit(a)
    archive = bench.seal()

    result, out = invoke(bench, write_config(bench), archive, "--allow-root-runs")

    assert result.exit_code == 17, result.output  # status failed
    summary = json.loads(result.stdout)
    assert summary["status"] == "failed" and summary["rewards"] == {"reward": 0.0}
    assert summary["chosen"]["candidate"] == a
    final = json.loads((out / "verifier" / "artifacts" / "finalization.json").read_text())
    assert final["targets"][0]["measured"] is False
    assert final["targets"][0]["error"].startswith("CaseMisconfigured (case_invalid)")
    assert {(p["case"], p["code"]) for p in final["problems"]} == {
        ("hidden-1", "case_invalid"),
        ("hidden-2", "case_invalid"),
    }
    assert all("missing instruction.md" in p["detail"] for p in final["problems"])
    assert json.loads((out / "verifier" / "reward.json").read_text()) == {"reward": 0.0}


def test_verify_command_with_an_unreadable_config_exits_2(bench: Workbench) -> None:
    bad = bench.root / "bad.json"
    bad.write_text('{"role": "verifier"}')
    result, out = invoke(bench, bad, bench.root / "missing.tar.gz")
    assert result.exit_code == 2
    assert "invalid spec" in result.stderr
    assert not (out / "verifier" / "reward.json").exists()


def _runner_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal applies to a root verifier")
def test_verify_command_as_root_without_a_runner_user_measures_nothing(bench: Workbench) -> None:
    user = "vero-test-absent-runner"
    assert not _runner_exists(user)
    a = bench.candidate("a\n")
    bench.submit(a)

    result, out = invoke(
        bench, write_config(bench, direction="minimize", failure_value=7e3), bench.seal(), "--runner-user", user
    )

    assert result.exit_code == 17, result.output  # status failed
    assert json.loads((out / "verifier" / "reward.json").read_text()) == {"reward": 7e3}
    final = json.loads((out / "verifier" / "artifacts" / "finalization.json").read_text())
    assert any("no unprivileged user" in e for e in final["errors"])
    assert final["measurements"][0]["error"].startswith("refused")
    assert not (out / "work" / "runs").exists()  # no checkout, no nested run


STUBBORN_HARBOR = """#!/bin/bash
# Stands in for `harbor run`: never finishes, ignores SIGTERM, leaves a child that ignores it too.
trap '' TERM
sleep 600 &
echo "$$ $!" > "$PWD/stubborn-harbor.pids"
wait
"""


@pytest.mark.timeout(120)
def test_sigterm_stops_the_verification_and_kills_its_nested_runs_at_once(tmp_path: Path) -> None:
    """`vero harbor verify` on SIGTERM (Docker stopping the verifier, Harbor's verifier timeout):
    the nested run's whole process group is killed without its grace period (600 s here, beyond
    this test's timeout) and the verification is cancelled."""
    import asyncio
    import signal
    import time

    from vero.commands.verify import _until_terminated
    from vero.core.run import NestedRun
    from vero.harbor import HarborBackend
    from vero.harbor.leftovers import new_session_id
    from vero.spec.models import CandidateRuntime, ScoringSpec

    harbor = tmp_path / "stubborn-harbor"
    harbor.write_text(STUBBORN_HARBOR)
    harbor.chmod(0o755)
    write_case(tmp_path / "cases", "c1")  # never run: the stand-in harbor reads no case
    (tmp_path / "candidate").mkdir()
    jobs = tmp_path / "jobs"
    backend = HarborBackend(harbor_executable=harbor, kill_grace_sec=600.0, session=new_session_id("verify"))
    run = NestedRun(
        evaluation_id="verify-target-0",
        partition="hidden",
        candidate="0" * 40,
        candidate_dir=tmp_path / "candidate",
        cases_dir=tmp_path / "cases",
        case_names=("c1",),
        jobs_dir=jobs,
        runtime=CandidateRuntime(kind="program", install_path="/opt/candidate"),
        harbor=HarborSpec(environment="stand-in", infra_retries=0, evaluation_timeout_sec=3600),
        scoring=ScoringSpec(),
    )
    pids_file = jobs / "stubborn-harbor.pids"

    async def scenario() -> None:
        verification = asyncio.ensure_future(_until_terminated(backend.evaluate(run), backend))
        while not pids_file.exists() or len(pids_file.read_text().split()) < 2:
            assert not verification.done(), verification
            await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(asyncio.CancelledError):
            await verification

    asyncio.run(scenario())
    assert backend.interrupted
    for pid in (int(p) for p in pids_file.read_text().split()):
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "\nState:\tZ" not in _status(pid):
            assert time.monotonic() < deadline, f"nested process {pid} survived the stop"
            time.sleep(0.05)


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return "\nState:\tZ"


def test_verify_under_its_subreaper_keeps_the_exit_code_output_and_reward(bench: Workbench) -> None:
    """`--subreaper` (what the compiled test.sh passes) runs the verification in a child of the
    command's process: the JSON on stdout, the exit code and the reward file are the same as without
    it (here: a tampered session, refused with exit 10 and failure values written)."""
    import subprocess
    import sys

    archive = bench.seal()
    config_path = write_config(bench)
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    archive.write_bytes(bytes(raw))
    out = bench.root / "reaped"
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("vero")),
            "harbor", "verify", "--subreaper",
            "--config", str(config_path), "--session", str(archive),
            "--cases-dir", str(bench.cases_dir), "--baseline-dir", str(bench.baseline_files),
            "--reward-path", str(out / "verifier" / "reward.json"),
            "--artifacts-dir", str(out / "verifier" / "artifacts"),
            "--mirror-dir", str(out / "artifacts"), "--work-dir", str(out / "work"),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 10, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"] == "refused"
    assert json.loads((out / "verifier" / "reward.json").read_text()) == {"reward": 0.0}
