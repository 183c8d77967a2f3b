"""`vero harbor verify` end to end through the CLI, with the real `HarborBackend`."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vero.cli import app
from vero.spec.models import HarborSpec

from verifier_bench import Workbench

pytestmark = pytest.mark.timeout(300)


def invoke(bench: Workbench, config_path: Path, archive: Path, *extra: str):
    out = bench.root / "cli"
    args = [
        "harbor", "verify", "--config", str(config_path), "--session", str(archive),
        "--cases-dir", str(bench.cases_dir), "--baseline-dir", str(bench.baseline_files),
        "--reward-path", str(out / "verifier" / "reward.json"),
        "--artifacts-dir", str(out / "verifier" / "artifacts"), "--mirror-dir", str(out / "artifacts"),
        "--work-dir", str(out / "work"), *extra,
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
    """The cases here are not runnable Harbor tasks: the real backend reports an infrastructure
    failure, and the submission gets the failure value instead of a score."""
    a = bench.candidate("a\n")
    bench.submit(a)
    archive = bench.seal()

    result, out = invoke(bench, write_config(bench), archive, "--allow-root-runs")

    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "failed" and summary["rewards"] == {"reward": 0.0}
    assert summary["chosen"]["candidate"] == a
    final = json.loads((out / "verifier" / "artifacts" / "finalization.json").read_text())
    assert final["targets"][0]["measured"] is False
    assert final["targets"][0]["error"].startswith("InfrastructureFailure")
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

    result, out = invoke(bench, write_config(bench, direction="minimize", failure_value=7e3), bench.seal(),
                         "--runner-user", user)

    assert result.exit_code == 1, result.output
    assert json.loads((out / "verifier" / "reward.json").read_text()) == {"reward": 7e3}
    final = json.loads((out / "verifier" / "artifacts" / "finalization.json").read_text())
    assert any("no unprivileged user" in e for e in final["errors"])
    assert final["measurements"][0]["error"].startswith("refused")
    assert not (out / "work" / "runs").exists()  # no checkout, no nested run
