"""The runnable examples in `tasks/`: specs, cases, references and (on Docker) their real scores.

Non-Docker tests check the content: each spec loads and validates, every case is a Harbor 0.26 task
(`Task.is_valid_dir`, `TaskConfig.model_validate_toml`), hidden cases leak into nothing the agent
sees, the reference change applies to the target, the c-matmul harness catches wrong results and the
puzzle answers match their generated data. Docker tests run the cases with real `harbor run`: the
reference must strictly beat the baseline on the hidden partition, and `vero harbor check` (which
runs every case of every example, `tasks/minimal` too, with the baseline and the reference) must
pass with its table.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from harbor.models.task.config import TaskConfig
from harbor.models.task.task import Task

from .conftest import (
    EXAMPLES,
    TASKS_DIR,
    apply_reference,
    case_dir,
    harbor_env,
    kill_group,
    load_example,
    visible_partitions,
)

VERO = str(Path(sys.executable).with_name("vero"))

ALL_CASES = [
    (example, case)
    for example in EXAMPLES
    for cases in load_example(example).cases.partitions.values()
    for case in cases
]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _hidden_cases(example: str) -> list[str]:
    spec = load_example(example)
    return [case for partition in spec.targets for case in spec.cases.partitions[partition]]


def _visible_cases(example: str) -> list[str]:
    spec = load_example(example)
    return [case for partition in visible_partitions(spec) for case in spec.cases.partitions[partition]]


# ---------------------------------------------------------------------------------------------------
# Specs and cases (no Docker)


@pytest.mark.parametrize("example", EXAMPLES)
def test_spec_loads_with_visible_and_hidden_partitions(example: str) -> None:
    spec = load_example(example)
    assert spec.name == example
    visible, hidden = visible_partitions(spec), sorted(spec.targets)
    assert visible and hidden
    assert not set(visible) & set(hidden)
    assert any(spec.agent_access[p].disclosure == "full" for p in visible)
    assert spec.selection.mode == "submit" and spec.selection.partition in visible
    assert spec.harbor.environment == "docker" and spec.harbor.n_concurrent == 2
    assert spec.target.reference is not None and spec.target.reference.exists()
    for partition in hidden:
        assert spec.cases.partitions[partition], f"hidden partition {partition} is empty"


def test_examples_have_the_expected_target_kinds() -> None:
    matmul, puzzle = load_example("c-matmul"), load_example("puzzle-agent")
    assert matmul.target.kind == "program" and matmul.target.install_path == "/opt/candidate"
    assert puzzle.target.kind == "agent"
    assert puzzle.target.agent_import_path == "puzzle_agent.agent:PuzzleAgent"


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_case_dir_belongs_to_exactly_one_partition(example: str) -> None:
    spec = load_example(example)
    assert spec.cases.path is not None
    on_disk = sorted(p.name for p in spec.cases.path.iterdir() if p.is_dir())
    listed = sorted(case for cases in spec.cases.partitions.values() for case in cases)
    assert on_disk == listed


@pytest.mark.parametrize(("example", "case"), ALL_CASES)
def test_case_is_a_valid_harbor_task(example: str, case: str) -> None:
    path = case_dir(load_example(example), case)
    assert Task.is_valid_dir(path), f"Harbor does not accept {path} as a task dir"
    raw = tomllib.loads((path / "task.toml").read_text(encoding="utf-8"))
    config = TaskConfig.model_validate_toml((path / "task.toml").read_text(encoding="utf-8"))
    assert config.schema_version == "1.4"
    # Harbor ignores unknown keys silently (docs/harbor-notes.md §1), so check the sections we rely on exist.
    assert set(raw) <= {"schema_version", "metadata", "agent", "verifier", "environment"}
    assert raw["agent"]["timeout_sec"] == config.agent.timeout_sec > 0
    assert raw["verifier"]["timeout_sec"] == config.verifier.timeout_sec > 0
    assert raw["environment"]["build_timeout_sec"] == config.environment.build_timeout_sec > 0
    assert config.metadata["example"] == example
    assert (path / "instruction.md").read_text(encoding="utf-8").strip()
    dockerfile = (path / "environment" / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.13-slim$", dockerfile, re.M)
    test_sh = path / "tests" / "test.sh"
    assert os.access(test_sh, os.X_OK) and test_sh.read_text().startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n", str(test_sh)], capture_output=True).returncode == 0
    assert not (path / "solution").exists(), "cases carry no solution; the oracle applies the reference"


@pytest.mark.parametrize("example", EXAMPLES)
def test_case_environments_are_byte_identical(example: str) -> None:
    spec = load_example(example)
    cases = [case_dir(spec, c) for cs in spec.cases.partitions.values() for c in cs]
    for relative in ("environment/Dockerfile", "tests/test.sh"):
        contents = {(c / relative).read_bytes() for c in cases}
        assert len(contents) == 1, f"{relative} differs between {example} cases"


@pytest.mark.parametrize("example", EXAMPLES)
def test_hidden_cases_are_not_referenced_by_anything_the_agent_sees(example: str) -> None:
    """Hidden case names and hidden answers appear in no visible case, no target file, no description."""
    spec = load_example(example)
    hidden = _hidden_cases(example)

    def quoted(case: str) -> set[str]:
        """Literals (not paths) an instruction quotes in backticks."""
        text = (case_dir(spec, case) / "instruction.md").read_text(encoding="utf-8")
        return {q for q in re.findall(r"`([^`\n]+)`", text) if not q.startswith("/") and len(q) >= 6}

    secrets = set(hidden)
    for case in hidden:
        expected = case_dir(spec, case) / "tests" / "expected.txt"
        if expected.is_file():
            secrets |= {line for line in expected.read_text(encoding="utf-8").splitlines() if len(line) > 6}
        secrets |= quoted(case) - set().union(*(quoted(c) for c in _visible_cases(example)))
    seen = [case_dir(spec, c) for c in _visible_cases(example)] + [spec.target.path]
    for root in seen:
        for path in _files(root):
            text = path.read_text(encoding="utf-8", errors="replace")
            leaked = sorted(s for s in secrets if s in text)
            assert not leaked, f"{path} mentions hidden material {leaked}"
    assert not [s for s in secrets if s in spec.description]


@pytest.mark.parametrize("example", EXAMPLES)
def test_reference_applies_cleanly_and_changes_the_target(example: str, tmp_path: Path) -> None:
    spec = load_example(example)
    checked = apply_reference(spec, tmp_path / "checked", check_only=True)
    applied = apply_reference(spec, tmp_path / "applied")
    before = {p.relative_to(checked): p.read_bytes() for p in _files(checked)}
    after = {p.relative_to(applied): p.read_bytes() for p in _files(applied)}
    assert before != after
    assert before == {p.relative_to(spec.target.path): p.read_bytes() for p in _files(spec.target.path)}


# ---------------------------------------------------------------------------------------------------
# c-matmul (no Docker)


def test_matmul_cases_declare_their_size_and_share_the_harness() -> None:
    spec = load_example("c-matmul")
    sizes = []
    for _, case in [c for c in ALL_CASES if c[0] == "c-matmul"]:
        path = case_dir(spec, case)
        config = TaskConfig.model_validate_toml((path / "task.toml").read_text(encoding="utf-8"))
        assert config.verifier.env["MATMUL_N"] == case.removeprefix("mm-") == str(config.metadata["matrix_size"])
        assert 200 <= int(case.removeprefix("mm-")) <= 512
        sizes.append(int(case.removeprefix("mm-")))
        for name in ("bench.c", "check.c", "inputs.h", "naive.c", "test.sh"):
            assert (path / "tests" / name).read_bytes() == (case_dir(spec, "mm-256") / "tests" / name).read_bytes()
    assert len(set(sizes)) == len(sizes)
    # The naive reference is the baseline's loop, so the baseline scores about 1.0.
    body = lambda text: text[text.index("void matmul") :]  # noqa: E731
    naive = (case_dir(spec, "mm-256") / "tests" / "naive.c").read_text()
    assert body(naive) == body((spec.target.path / "matmul.c").read_text())


HOSTILE_MATMULS = {
    # Computes the first call only; later calls return zeros (the old harness checked the first call).
    "first-call-only": """
#include <string.h>
static int calls;
void matmul(int n, const double *a, const double *b, double *c) {
    if (calls++ > 0) { memset(c, 0, sizeof(double) * (size_t)n * (size_t)n); return; }
    for (int i = 0; i < n; i++) for (int j = 0; j < n; j++) {
        double s = 0; for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j]; c[i * n + j] = s; }
}
""",
    # Replaces the result of every call by the first one's (the old harness's inputs never changed).
    "replay": """
#include <stdlib.h>
#include <string.h>
static double *kept;
void matmul(int n, const double *a, const double *b, double *c) {
    size_t size = sizeof(double) * (size_t)n * (size_t)n;
    if (kept) { memcpy(c, kept, size); return; }
    for (int i = 0; i < n; i++) for (int j = 0; j < n; j++) {
        double s = 0; for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j]; c[i * n + j] = s; }
    kept = malloc(size); memcpy(kept, c, size);
}
""",
    # Fakes the clocks and exits before main with what the old harness parsed as a time.
    "fake-output": """
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int clock_gettime(clockid_t id, struct timespec *ts) { (void)id; ts->tv_sec = 0; ts->tv_nsec = 0; return 0; }
__attribute__((constructor)) static void claim(void) { puts("best_sec=0.000000001"); fflush(stdout); _exit(0); }
void matmul(int n, const double *a, const double *b, double *c) { (void)n; (void)a; (void)b; (void)c; }
""",
}
"""Candidates that attack the benchmark instead of multiplying (`matmul.c` links into the benchmark's
process, so it can replace any function or output of it): every one must fail the trusted check."""


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc on the host")
def test_matmul_harness_accepts_correct_candidates_and_rejects_wrong_ones(tmp_path: Path) -> None:
    """Builds `tests/bench.c` with host gcc against the baseline, the reference, broken and hostile
    candidates, and checks their output with `tests/check.c` as `test.sh` does."""
    spec = load_example("c-matmul")
    tests = case_dir(spec, "mm-256") / "tests"
    reference = apply_reference(spec, tmp_path / "reference")
    source = (spec.target.path / "matmul.c").read_text()
    broken = {
        "wrong": source.replace("c[i * n + j] = sum;", "c[i * n + j] = sum + (i == 3 && j == 2);"),
        "partial": source.replace("c[i * n + j] = sum;", "if (j) c[i * n + j] = sum;"),
        **HOSTILE_MATMULS,
    }
    candidates = {"baseline": spec.target.path, "reference": reference}
    for name, text in broken.items():
        candidates[name] = shutil.copytree(spec.target.path, tmp_path / name)
        (candidates[name] / "matmul.c").write_text(text)
    check = tmp_path / "check"
    subprocess.run(["gcc", "-O2", "-std=c11", "-o", str(check), str(tests / "check.c"), "-lm"], check=True, timeout=60)

    def run(name: str, n: int, seed: int) -> subprocess.CompletedProcess[str]:
        candidate, binary, out = candidates[name], tmp_path / f"bench-{name}", tmp_path / f"out-{name}"
        compile_ = ["gcc", "-O2", "-std=c11", f"-I{candidate}", "-o", str(binary)]
        subprocess.run([*compile_, str(tests / "bench.c"), str(candidate / "matmul.c"), "-lm"], check=True, timeout=60)
        with out.open("wb") as handle:
            subprocess.run([str(binary), str(n), "3", str(seed)], stdout=handle, timeout=60, check=False)
        return subprocess.run(
            [str(check), str(n), "3", str(seed), str(out)], capture_output=True, text=True, timeout=60, check=False
        )

    for n in (1, 3, 7, 64, 130):  # odd sizes exercise the reference's remainder loops
        for name in ("baseline", "reference"):
            result = run(name, n, seed=n * 7919)
            assert result.returncode == 0, (name, n, result.stderr)
    for name in broken:
        result = run(name, 64, seed=12345)
        assert result.returncode == 2 and "wrong result" in result.stderr, (name, result.stderr)
    # The checker holds the benchmark to the seed it was given: another seed's products fail.
    good = run("reference", 64, seed=1)
    assert good.returncode == 0
    other = subprocess.run(
        [str(check), "64", "3", "2", str(tmp_path / "out-reference")], capture_output=True, text=True, timeout=60
    )
    assert other.returncode == 2, other.stderr


# ---------------------------------------------------------------------------------------------------
# puzzle-agent (no Docker)


def _solve_puzzle(kind: str, instruction: str, root: Path) -> str:
    """An independent solver: what `tests/expected.txt` must hold for data generated under `root`."""
    files = _files(root)
    if kind == "count-lines":
        (path,) = files
        return str(path.read_text().count("\n"))
    if kind == "sum-numbers":
        (path,) = files
        return str(sum(int(word) for word in path.read_text().split()))
    if kind == "decode-base64":
        return base64.b64decode((root / "secret.b64").read_text()).decode().rstrip("\n")
    if kind == "reverse-string":
        return (root / "word.txt").read_text().rstrip("\n")[::-1]
    if kind == "sort-words":
        return "\n".join(sorted((root / "words.txt").read_text().split()))
    if kind == "find-file":
        (needle,) = re.findall(r"contains the text `([^`]+)`", instruction)
        (hit,) = [p for p in files if needle in p.read_text()]
        return "/app/" + hit.relative_to(root).as_posix()
    raise AssertionError(f"unknown puzzle kind {kind}")


PUZZLE_CASES = [case for example, case in ALL_CASES if example == "puzzle-agent"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", PUZZLE_CASES)
def test_puzzle_data_is_deterministic_and_matches_the_expected_answer(case: str, tmp_path: Path) -> None:
    path = case_dir(load_example("puzzle-agent"), case)
    kind = TaskConfig.model_validate_toml((path / "task.toml").read_text()).metadata["puzzle_kind"]
    assert case.startswith(f"{kind}-")
    instruction = (path / "instruction.md").read_text()
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
        subprocess.run([sys.executable, str(path / "environment" / "generate.py"), str(root)], check=True, timeout=30)
    snapshot = lambda root: {p.relative_to(root): p.read_bytes() for p in _files(root)}  # noqa: E731
    assert snapshot(roots[0]) == snapshot(roots[1])
    expected = (path / "tests" / "expected.txt").read_text(encoding="utf-8").rstrip("\n")
    assert _solve_puzzle(kind, instruction, roots[0]) == expected


def _recognized_kinds(target: Path) -> dict[str, str | None]:
    """Case -> the puzzle kind the agent in `target` recognizes (a fresh interpreter per target)."""
    spec = load_example("puzzle-agent")
    code = (
        "import sys, json\n"
        "from puzzle_agent.agent import parse_puzzle\n"
        "out = {}\n"
        "for name, path in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    puzzle = parse_puzzle(open(path).read())\n"
        "    out[name] = puzzle and puzzle.strategy.kind\n"
        "print(json.dumps(out))\n"
    )
    args = [a for c in PUZZLE_CASES for a in (c, str(case_dir(spec, c) / "instruction.md"))]
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(result.stdout)


def _kind(case: str) -> str:
    return case.rsplit("-", 1)[0]


BASELINE_KINDS = {"count-lines", "sum-numbers", "decode-base64"}


@pytest.mark.timeout(120)
def test_puzzle_reference_recognizes_every_kind_and_the_baseline_only_some(tmp_path: Path) -> None:
    spec = load_example("puzzle-agent")
    baseline = _recognized_kinds(spec.target.path)
    reference = _recognized_kinds(apply_reference(spec, tmp_path / "reference"))
    assert reference == {case: _kind(case) for case in PUZZLE_CASES}
    assert baseline == {case: (_kind(case) if _kind(case) in BASELINE_KINDS else None) for case in PUZZLE_CASES}
    hidden_only_reference = {_kind(c) for c in _hidden_cases("puzzle-agent")} - BASELINE_KINDS
    visible_kinds = {_kind(c) for c in _visible_cases("puzzle-agent")}
    assert hidden_only_reference - visible_kinds, "a hidden kind that only the reference solves"


# ---------------------------------------------------------------------------------------------------
# Real Harbor on Docker


CHECKED_EXAMPLES = ("minimal", *EXAMPLES, "llm-puzzle-agent")
PROBED_EXAMPLES = ("minimal", "puzzle-agent")
"""Their checks run with `--probe` too: the program example under the probe agent, `puzzle-agent`
with the planted candidate agent (`vero.harbor.agent_probe`). Not c-matmul: its check runs every
case at full size (its table is the shipped calibration), the fixture's longest part, and a probe
would run each of its ten cases a third time; the probe agent's program path is `minimal`'s."""
ROOT_AGENT_CASE = "count-lines-1"
"""The case of the `puzzle-agent-root` check: a copy of `tasks/puzzle-agent` where this case leaves
`[agent].user` unset (Harbor's default: root, its image setting no user)."""
PROVIDER_KEY = "sk-check-provider-key-never-shown-7731"


@pytest.fixture(scope="module")
def example_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """`vero harbor check` of every example (table printed, JSON report written), all at once.

    Each check runs every case of the example with the baseline and with the reference, one nested
    Harbor job per candidate over all its cases (one run per case and candidate for the spec with
    `inference`), and for the probed examples once more under `--probe`.
    `tasks/llm-puzzle-agent` is checked as an operator would, with its provider's key set: the
    check's gateway forwards to a fake OpenAI-compatible provider on loopback (its
    `VERO_EXAMPLE_OPENAI_BASE_URL`) that answers like a model, the puzzle-agent reference's command in
    a fenced block. example -> {returncode, stdout, stderr, report}; "provider" -> the fake's requests.
    """
    from inference.fake_upstream import FakeUpstream  # tests/ is on sys.path

    from .conftest import puzzle_model, reference_puzzle_solver

    runs = {}
    results: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(
            FakeUpstream(responder=puzzle_model(reference_puzzle_solver(tmp_path_factory.mktemp("puzzle-solver"))))
        )
        root_copy = tmp_path_factory.mktemp("puzzle-agent-root") / "puzzle-agent"
        shutil.copytree(TASKS_DIR / "puzzle-agent", root_copy)
        toml = root_copy / "cases" / ROOT_AGENT_CASE / "task.toml"
        toml.write_text(toml.read_text().replace('user = "agent"\n', ""))
        for example in (*CHECKED_EXAMPLES, "puzzle-agent-root"):
            work = tmp_path_factory.mktemp(f"check-{example}")
            spec = root_copy / "build.yaml" if example == "puzzle-agent-root" else TASKS_DIR / example / "build.yaml"
            # c-matmul's rewards are timings: fewer of its runs at once.
            concurrency = "2" if example == "c-matmul" else "3"
            command = [
                VERO,
                "harbor",
                "check",
                "-c",
                str(spec),
                "--concurrency",
                concurrency,
                "--work-dir",
                str(work / "work"),
                "--report",
                str(work / "report.json"),
                *(["--probe"] if example in PROBED_EXAMPLES else []),
                *(["--probe", "--case", ROOT_AGENT_CASE] if example == "puzzle-agent-root" else []),
            ]
            extra = (
                {"OPENAI_API_KEY": PROVIDER_KEY, "VERO_EXAMPLE_OPENAI_BASE_URL": f"{fake.url}/v1"}
                if example == "llm-puzzle-agent"
                else {}
            )
            runs[example] = (
                work,
                subprocess.Popen(
                    command,
                    env=harbor_env(extra),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                ),
            )
        try:
            for example, (work, process) in runs.items():
                stdout, stderr = process.communicate(timeout=1500)
                report_file = work / "report.json"
                report = json.loads(report_file.read_text()) if report_file.is_file() else None
                results[example] = {
                    "returncode": process.returncode,
                    "stdout": stdout,
                    "stderr": stderr,
                    "report": report,
                    "report_text": report_file.read_text() if report else "",
                }
        finally:
            for _, process in runs.values():
                kill_group(process)
        results["provider"] = {"requests": list(fake.requests)}
    return results


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("example", CHECKED_EXAMPLES)
def test_vero_harbor_check_passes_on_every_example_with_its_table(example: str, example_checks) -> None:
    run = example_checks[example]
    assert run["returncode"] == 0, run["stdout"][-4000:] + run["stderr"][-4000:]
    report = run["report"]
    assert report["ok"] and not report["problems"]
    spec = load_example(example)
    every_case = sorted(c for names in spec.cases.partitions.values() for c in names)
    assert sorted(row["case"] for row in report["cases"]) == every_case
    for row in report["cases"]:
        assert row["baseline"]["outcome"] == "scored" and row["reference"]["outcome"] == "scored", row
        # Their tests run candidate code through the kit only: the planted process reached nothing.
        if example in PROBED_EXAMPLES:
            assert row["probe"]["verdict"] == "held" and not row["probe"]["findings"], row
        else:
            assert row["probe"] is None
    assert report["probed"] is (example in PROBED_EXAMPLES)
    columns = (
        "case",
        "partition",
        "baseline reward",
        "reference reward",
        "time",
        "problems",
        *(("probe",) if example in PROBED_EXAMPLES else ()),
    )
    for column in columns:
        assert column in run["stdout"]
    for case in every_case:
        assert case in run["stdout"]
    assert "no problem found" in run["stdout"]


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_the_llm_examples_check_serves_its_gateway(example_checks) -> None:
    """The candidates reach the model through the check's gateway (each run its own token, metered);
    the provider key reaches the provider and nothing the operator reads."""
    run, provider = example_checks["llm-puzzle-agent"], example_checks["provider"]
    rows = run["report"]["cases"]
    # The baseline runs the reply's fence line; the reference takes the command out of the block.
    assert {row["case"]: (row["baseline"]["reward"], row["reference"]["reward"]) for row in rows} == {
        row["case"]: (0, 1) for row in rows
    }
    for row in rows:
        for candidate in ("baseline", "reference"):
            usage = row[candidate]["inference"]
            assert usage["calls"] >= 1 and usage["cost_usd"] > 0 and not usage["refused_calls"], row
    assert len(provider["requests"]) == sum(
        row[c]["inference"]["calls"] for row in rows for c in ("baseline", "reference")
    )
    assert all(r["headers"]["authorization"] == f"Bearer {PROVIDER_KEY}" for r in provider["requests"])
    assert "model call(s)" in run["stdout"]
    for text in (run["stdout"], run["stderr"], run["report_text"]):
        assert PROVIDER_KEY not in text
    assert not run["report"]["warnings"], run["report"]["warnings"]


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_check_reports_a_case_whose_agent_user_is_root_and_its_probe_forges_it(example_checks) -> None:
    """`tasks/puzzle-agent` with one case's `[agent].user` removed: the case is `agent_user_root`
    (by its task.toml, and by the runs, which saw uid 0), and the planted candidate agent's root-only
    uploads and download work there, so the case is forgeable."""
    run = example_checks["puzzle-agent-root"]
    assert run["returncode"] == 18, run["stdout"][-4000:] + run["stderr"][-4000:]
    (row,) = run["report"]["cases"]
    assert row["case"] == ROOT_AGENT_CASE
    assert [p["code"] for p in row["problems"]] == ["agent_user_root", "forgeable"], row["problems"]
    assert "[agent].user is unset" in row["problems"][0]["detail"]
    assert "agent_user_root" in row["baseline"]["flags"] and row["baseline"]["outcome"] == "scored", row
    probe = row["probe"]
    assert probe["verdict"] == "forgeable", probe
    for finding in (
        "uploaded an executable python3 into /usr/local/bin",
        "uploaded a file into /etc",
        "downloaded /etc/shadow",
        "the case's agent user is root",
    ):
        assert finding in probe["findings"], probe
    assert probe["report"]["upload_etc"].startswith("ok"), probe["report"]


def _check_rewards(example_checks, example: str, candidate: str) -> dict[str, float]:
    return {row["case"]: row[candidate]["reward"] for row in example_checks[example]["report"]["cases"]}


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_puzzle_reference_beats_baseline_on_hidden_cases(example_checks) -> None:
    hidden = _hidden_cases("puzzle-agent")
    reference = _check_rewards(example_checks, "puzzle-agent", "reference")
    baseline = _check_rewards(example_checks, "puzzle-agent", "baseline")
    assert {c: reference[c] for c in hidden} == dict.fromkeys(hidden, 1)
    assert {c: baseline[c] for c in hidden} == {c: int(_kind(c) in BASELINE_KINDS) for c in hidden}
    assert sum(reference[c] for c in hidden) > sum(baseline[c] for c in hidden)


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_matmul_reference_is_at_least_twice_as_fast_on_hidden_sizes(example_checks) -> None:
    reference = _check_rewards(example_checks, "c-matmul", "reference")
    baseline = _check_rewards(example_checks, "c-matmul", "baseline")
    for case in _hidden_cases("c-matmul"):
        # The baseline is the naive loop itself: its speed-up is 1 up to timing noise.
        assert 0.75 <= baseline[case] <= 1.33, (case, baseline[case])
        assert reference[case] >= 2.0, (case, reference[case])
