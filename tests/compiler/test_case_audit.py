"""Where a program candidate runs in a case (`vero.compiler.case_audit.audit_case`), read with Harbor's
own verifier-mode resolution, for every shape of task Harbor runs: single step or steps, shared or
separate verifier (by `environment_mode`, by a `[verifier.environment]`, per step), and the network
each phase runs with."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vero.compiler.case_audit import audit_case
from vero.errors import SpecError

pytestmark = pytest.mark.timeout(60)


def case(root: Path, name: str, toml: str, tests: dict[str, str]) -> Path:
    """A task dir: `task.toml` and the test files given (path under the case -> text)."""
    path = root / name
    (path / "environment").mkdir(parents=True)
    (path / "environment" / "Dockerfile").write_text("FROM python:3.13-slim\n")
    (path / "instruction.md").write_text("Do it.\n")
    (path / "task.toml").write_text('schema_version = "1.4"\n' + textwrap.dedent(toml))
    for rel, text in tests.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def test_a_shared_single_step_case_is_audited_for_the_kit(tmp_path):
    plain = audit_case(case(tmp_path, "plain", "", {"tests/test.sh": "python3 grade.py\n"}))
    assert [(v.step, v.mode) for v in plain.verifications] == [(None, "shared")]
    assert plain.kit_applies and plain.kit_missing and not plain.without_artifacts
    kit = audit_case(case(tmp_path, "kit", "", {"tests/test.sh": "vero-kit run -- ./prog\nvero-kit reward 1\n"}))
    assert kit.kit_applies and not kit.kit_missing


def test_every_step_of_a_multi_step_case_counts_and_steps_may_mix_modes(tmp_path):
    toml = """
    artifacts = ["/app/out.json"]

    [environment]
    network_mode = "no-network"

    [verifier]
    network_mode = "public"

    [[steps]]
    name = "build"

    [[steps]]
    name = "grade"
    artifacts = ["/app/report.json"]
    [steps.verifier]
    environment_mode = "separate"
    env = { GRADER = "${GRADER_KEY}" }
    """
    tests = {
        "steps/build/tests/test.sh": "vero-kit run -- make\nvero-kit reward 1\n",
        "steps/grade/tests/test.sh": "python3 /tests/grade.py\n",
    }
    audit = audit_case(case(tmp_path, "mixed", toml, tests))
    assert [(v.step, v.mode) for v in audit.verifications] == [("build", "shared"), ("grade", "separate")]
    # Only the shared step's tests must call the kit: the separate one's cannot have it.
    assert audit.kit_applies and not audit.kit_missing
    (separate,) = audit.separate
    assert separate.artifacts == ("/app/out.json", "/app/report.json") and not audit.without_artifacts
    assert separate.env == {"GRADER": "${GRADER_KEY}"}
    assert (audit.agent_network_mode, audit.shared[0].network_mode) == ("no-network", "public")
    # A shared step that never names the kit is kit_missing, whatever the other steps do.
    tests["steps/build/tests/test.sh"] = "make && echo 1 > /logs/verifier/reward.txt\n"
    assert audit_case(case(tmp_path, "mixed-2", toml, tests)).kit_missing


def test_a_separate_verifier_is_audited_as_such(tmp_path):
    # By its mode, and by a [verifier.environment] alone (which implies separate).
    for name, toml in (
        ("by-mode", '[verifier]\nenvironment_mode = "separate"\n'),
        ("by-env", '[verifier.environment]\ndocker_image = "python:3.13-slim"\n'),
    ):
        audit = audit_case(case(tmp_path, name, toml, {"tests/test.sh": "python3 grade.py\n"}))
        assert [v.mode for v in audit.verifications] == ["separate"], name
        assert not audit.kit_applies and not audit.kit_missing, name
        assert [v.label for v in audit.without_artifacts] == ["its verification"], name
    graded = audit_case(
        case(
            tmp_path,
            "graded",
            'artifacts = [{ source = "/app/out.json" }]\n[verifier]\nenvironment_mode = "separate"\n',
            {"tests/test.sh": "python3 grade.py\n"},
        )
    )
    assert graded.separate[0].artifacts == ("/app/out.json",) and not graded.without_artifacts


def test_an_unreadable_task_is_a_spec_error_naming_the_case(tmp_path):
    broken = case(tmp_path, "broken", "[agent\n", {"tests/test.sh": "true\n"})
    with pytest.raises(SpecError, match="'broken'"):
        audit_case(broken)
