"""`vero harbor run` up to the Harbor call: env files, secrets, execution-target checks, overrides.

The full run on Docker is exercised by tests/e2e; these tests cover what happens before Harbor
starts, where a mistake must fail fast, clearly, and before anything is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from compiler.conftest import all_files, make_spec_tree, run_vero

from vero.errors import InfrastructureFailure, SpecError
from vero.launch import prepare_task

pytestmark = pytest.mark.timeout(300)

SECRET_VALUE = "tok-4f9a1c77e2b84d0b9c1e"


def _custom_env(document: dict) -> None:
    # Any Harbor environment name is allowed; vero checks docker and modal only, so this reaches the compiler.
    document["harbor"]["environment"] = "mylab"


def test_env_file_secrets_reach_the_build_but_no_compiled_file(tmp_path: Path) -> None:
    tree = make_spec_tree(tmp_path / "spec", lambda d: (_custom_env(d), d.update(secrets=["LAB_TOKEN"])))
    env_file = tmp_path / "run.env"
    env_file.write_text(f"LAB_TOKEN={SECRET_VALUE}\n# comment\nOTHER=1\n")
    prepared = prepare_task(tree.path, env_file=env_file, work_dir=tmp_path / "work")
    assert prepared.env["LAB_TOKEN"] == SECRET_VALUE
    assert (prepared.task_dir / "task.toml").is_file()
    files = all_files(tmp_path / "work")
    assert files and not [f for f in files if SECRET_VALUE.encode() in f.read_bytes()]
    assert "${LAB_TOKEN}" in (prepared.task_dir / "task.toml").read_text()


def test_a_secret_missing_from_env_and_env_file_fails_before_anything_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("LAB_TOKEN", raising=False)
    tree = make_spec_tree(tmp_path / "spec", lambda d: (_custom_env(d), d.update(secrets=["LAB_TOKEN"])))
    with pytest.raises(SpecError) as info:
        prepare_task(tree.path, work_dir=tmp_path / "work")
    assert info.value.issues[0].loc == "secrets[0]"
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def test_switching_to_modal_checks_modal_before_building(tmp_path: Path, monkeypatch) -> None:
    tree = make_spec_tree(tmp_path / "spec")
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    with pytest.raises(InfrastructureFailure) as info:
        prepare_task(tree.path, environment="modal", work_dir=tmp_path / "work")
    # Either the extra is missing here or the credentials are: both are said before building.
    assert "modal" in str(info.value).lower()
    assert not (tmp_path / "work").exists()


def test_switching_to_modal_adds_the_modal_extra_to_an_exact_harbor_pin(tmp_path: Path, monkeypatch) -> None:
    tree = make_spec_tree(tmp_path / "spec")  # harbor==0.26.0 on docker
    checked: list[str] = []
    monkeypatch.setattr("vero.launch.check_execution_target", lambda environment, env: checked.append(environment))
    env_file = tmp_path / "modal.env"
    env_file.write_text("MODAL_TOKEN_ID=id-zq-0001\nMODAL_TOKEN_SECRET=secret-zq-0002\n")
    prepared = prepare_task(tree.path, environment="modal", env_file=env_file, work_dir=tmp_path / "work")
    assert checked == ["modal"]
    assert prepared.spec.harbor.environment == "modal"
    assert prepared.spec.harbor.requirement == "harbor[modal]==0.26.0"
    pins = (prepared.task_dir / "environment" / "sidecar" / "dist" / "requirements.txt").read_text().splitlines()
    assert "harbor[modal]==0.26.0" in pins


def test_cli_missing_env_file_is_a_usage_error(tmp_path: Path) -> None:
    tree = make_spec_tree(tmp_path / "spec")
    done = run_vero("harbor", "run", "-c", str(tree.path), "--env-file", str(tmp_path / "nope.env"))
    assert done.returncode == 2
    assert "--env-file" in done.stderr and "Traceback" not in done.stderr


def test_cli_unreachable_docker_fails_fast_without_compiling(tmp_path: Path) -> None:
    tree = make_spec_tree(tmp_path / "spec")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run_vero(
        "harbor",
        "run",
        "-c",
        str(tree.path),
        "--jobs-dir",
        str(tmp_path / "jobs"),
        env={"DOCKER_HOST": "unix:///nonexistent/docker.sock", "TMPDIR": str(scratch)},
    )
    assert done.returncode == 5, done.stderr
    assert "Docker engine is not reachable" in done.stderr
    assert list(scratch.iterdir()) == []
    assert not (tmp_path / "jobs").exists()


def test_cli_invalid_spec_names_the_field(tmp_path: Path) -> None:
    tree = make_spec_tree(tmp_path / "spec", lambda d: d["harbor"].update(requirement="harbor>=0.26"))
    done = run_vero("harbor", "run", "-c", str(tree.path))
    assert done.returncode == 2
    assert "harbor.requirement" in done.stderr and "Traceback" not in done.stderr


def test_cli_unknown_agent_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    tree = make_spec_tree(tmp_path / "spec")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run_vero(
        "harbor",
        "run",
        "-c",
        str(tree.path),
        "--agent",
        "orcale",
        "--jobs-dir",
        str(tmp_path / "jobs"),
        env={"TMPDIR": str(scratch)},
    )
    assert done.returncode == 2
    assert "--agent" in done.stderr and "oracle" in done.stderr and "Traceback" not in done.stderr
    assert "invalid spec" not in done.stderr  # the spec is fine; the option is not
    assert list(scratch.iterdir()) == [] and not (tmp_path / "jobs").exists()


def test_cli_jobs_dir_that_cannot_be_created_is_a_usage_error(tmp_path: Path, monkeypatch) -> None:
    tree = make_spec_tree(tmp_path / "spec", _custom_env)  # no Docker check for a custom environment
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    done = run_vero(
        "harbor", "run", "-c", str(tree.path), "--jobs-dir", str(blocker / "jobs"), env={"TMPDIR": str(tmp_path)}
    )
    assert done.returncode == 2, done.stderr
    assert "--jobs-dir" in done.stderr and "Traceback" not in done.stderr


def test_the_outcome_is_printed_as_text_and_a_broken_case_is_a_cause_not_a_score(tmp_path: Path, capsys) -> None:
    """The chosen candidate's subject is the agent's text: printed as is, never read as markup. A
    target left unmeasured by a case where no candidate installs exits 17 with the cause."""
    from vero.commands.run import report_outcome
    from vero.launch import TaskRunOutcome

    trial = tmp_path / "trial"
    trial.mkdir()
    problem = {
        "case": "log-report",
        "code": "install_failed",
        "detail": "vero's install agent cannot install the baseline in this case, so no candidate can be "
        "measured there: install_command exited with code 1: PermissionError: [Errno 13] '/app/report.json'",
    }
    outcome = TaskRunOutcome(
        job_dir=tmp_path,
        task_dir=tmp_path / "task",
        trial_dir=trial,
        rewards={"reward": 0.0},
        finalization={
            "status": "failed",
            "chosen": {"candidate": "c" * 40, "is_baseline": False, "subject": "[bold]faster[/bold] loops"},
            "problems": [problem],
            "errors": ["target hidden: CaseMisconfigured (install_failed): ..."],
        },
    )
    assert report_outcome(outcome) == 17
    printed = capsys.readouterr()
    assert "[bold]faster[/bold] loops" in printed.out
    assert f"cause: case 'log-report': install_failed: {problem['detail']}" in printed.err
