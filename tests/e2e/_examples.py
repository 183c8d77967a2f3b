"""Helpers of the example end-to-end tests (`test_examples_e2e.py`): whole `vero harbor run`s
of the examples on real Docker, and the file listings of the compiled task's real images.

Everything goes through the real programs: the venv's `vero` console script (which compiles the
spec and runs the pinned Harbor), `docker compose build` on the compiled task's own compose files,
and `docker export` of a container created from each image. Rewards are read from the trial's
`result.json` (`verifier_result.rewards`), never from an exit code or stdout (docs/harbor-notes.md §2).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from examples.conftest import (  # tests/ on sys.path
    EXAMPLES,
    HARBOR,
    REPO_ROOT,
    TASKS_DIR,
    harbor_env,
    kill_group,
    matmul_test_sized,
)

from vero.spec import load_spec
from vero.spec.compiled import VerifierConfig, load_config

__all__ = [
    "EXAMPLES",
    "HARBOR",
    "ExampleRun",
    "build_image",
    "compose_build",
    "harbor_env",
    "hidden_cases",
    "image_exists",
    "kill_group",
    "list_image",
    "matmul_test_sized",
    "remove_images",
    "secret_env",
    "start_run",
    "wait_run",
]

VERO = str(Path(sys.executable).with_name("vero"))
"""The installed console script (the venv's `bin/vero`), as a user would run it."""

RUN_TIMEOUT_SEC = 1500
"""Upper bound for one `vero harbor run` of an example (a healthy one takes a few minutes)."""
MIN_MARKER_BYTES = 32
"""Hidden files shorter than this are not used as content markers: a short answer such as `1748`
could occur in an unrelated file of an image by chance."""


def build_spec_path(example: str) -> Path:
    return TASKS_DIR / example / "build.yaml"


def secret_env(example: str) -> dict[str, str]:
    """A placeholder value for every secret the example's spec names (compose and lint need them set)."""
    spec = load_spec(build_spec_path(example))
    return {name: f"e2e-placeholder-{name.lower()}" for name in spec.secrets}


# --------------------------------------------------------------------------------------------
# `vero harbor run`


@dataclass
class ExampleRun:
    """One finished `vero harbor run --config tasks/<example>/build.yaml --agent <agent>`.

    Attributes:
        returncode: the CLI's exit code (0 when the trial produced a reward without error).
        output: its stdout and stderr (Harbor's progress and vero's table), for diagnostics.
        job_dir: Harbor's job directory.
        trial_dir: the single trial's directory.
        result: the trial's `result.json`.
        task_dir: the task the command compiled (under the run's own TMPDIR).
        seconds: wall time of the command.
    """

    example: str
    agent: str
    returncode: int
    output: str
    job_dir: Path
    trial_dir: Path
    result: dict
    task_dir: Path
    seconds: float
    _finalization: dict | None = field(default=None, repr=False)

    @property
    def reward(self) -> float:
        """`verifier_result.rewards["reward"]` of the trial (the example's single target's key)."""
        rewards = (self.result.get("verifier_result") or {}).get("rewards") or {}
        assert "reward" in rewards, (
            f"{self.describe()}: no reward in the trial result: {self.result.get('exception_info')}"
        )
        return float(rewards["reward"])

    @property
    def finalization(self) -> dict:
        """The verifier's `finalization.json`, from `<trial>/verifier/artifacts/`."""
        if self._finalization is None:
            path = self.trial_dir / "verifier" / "artifacts" / "finalization.json"
            assert path.is_file(), f"{self.describe()}: no {path}"
            self._finalization = json.loads(path.read_text(encoding="utf-8"))
        return self._finalization

    @property
    def verifier_config(self) -> VerifierConfig:
        """The compiled `tests/config.json` of the task this run used."""
        return load_config(self.task_dir / "tests" / "config.json", VerifierConfig)

    @property
    def session_archive(self) -> Path:
        """The sealed session Harbor collected from eval-sidecar (`/export/vero` -> trial artifacts)."""
        return self.trial_dir / "artifacts" / "export" / "vero" / "session.tar.gz"

    def phases(self) -> str:
        """The trial's phase durations from `result.json`, e.g. `setup 6 s, agent 31 s, verifier 42 s`."""

        def seconds(key: str) -> str:
            phase = self.result.get(key) or {}
            if not phase.get("started_at") or not phase.get("finished_at"):
                return "-"
            span = datetime.fromisoformat(phase["finished_at"]) - datetime.fromisoformat(phase["started_at"])
            return f"{span.total_seconds():.0f} s"

        return (
            f"{self.agent}: command {self.seconds:.0f} s (environment {seconds('environment_setup')}, "
            f"agent {seconds('agent_execution')}, verifier {seconds('verifier')})"
        )

    def describe(self) -> str:
        return f"vero harbor run {self.example} --agent {self.agent} (trial {self.trial_dir})"

    def diagnostics(self) -> str:
        """The tail of the command's output and the verifier's stdout, for assertion messages."""
        parts = [self.describe(), "--- output (tail):", self.output[-3000:]]
        verifier_out = self.trial_dir / "verifier" / "test-stdout.txt"
        if verifier_out.is_file():
            parts += ["--- verifier test-stdout.txt (tail):", verifier_out.read_text(errors="replace")[-3000:]]
        return "\n".join(parts)


@dataclass
class _Started:
    example: str
    agent: str
    process: subprocess.Popen[bytes]
    log: Path
    jobs_dir: Path
    job_name: str
    tmp: Path
    started: float
    watcher: threading.Thread
    ended: list[float] = field(default_factory=list)
    """When the process exited (set by `watcher`), so concurrent runs are timed separately."""


def start_run(
    example: str,
    agent: str,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    spec: Path | None = None,
) -> _Started:
    """Start `vero harbor run` in its own process group; its compiled task goes to `<workdir>/tmp`.

    `extra_args` are further `vero harbor run` options (e.g. `--model`). `spec`: another spec than
    `tasks/<example>/build.yaml` (named `example`); `extra_env` then gives its secrets."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True)
    jobs_dir = workdir / "jobs"
    job_name = f"e2e-{example}-{agent}-{uuid.uuid4().hex[:6]}"
    log = workdir / "vero-run.log"
    argv = [
        VERO,
        "harbor",
        "run",
        "--config",
        str(spec or build_spec_path(example)),
        "--agent",
        agent,
        "--jobs-dir",
        str(jobs_dir),
        "--job-name",
        job_name,
        *(extra_args or []),
    ]
    env = harbor_env({"TMPDIR": str(tmp), **(secret_env(example) if spec is None else {}), **(extra_env or {})})
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ended: list[float] = []
    watcher = threading.Thread(target=lambda: (process.wait(), ended.append(time.monotonic())), daemon=True)
    watcher.start()
    return _Started(example, agent, process, log, jobs_dir, job_name, tmp, time.monotonic(), watcher, ended)


def wait_run(started: _Started, timeout_sec: float = RUN_TIMEOUT_SEC) -> ExampleRun:
    """Wait for a run and read its trial; the whole process group is killed on timeout.

    Raises:
        AssertionError: timeout, no trial, or no compiled task (with the command's output).
    """
    remaining = max(1.0, timeout_sec - (time.monotonic() - started.started))
    try:
        started.process.wait(timeout=remaining)
    except subprocess.TimeoutExpired:
        kill_group(started.process)
        raise AssertionError(
            f"vero harbor run {started.example} --agent {started.agent} did not finish "
            f"in {timeout_sec} s:\n{started.log.read_text(errors='replace')[-3000:]}"
        ) from None
    started.watcher.join(timeout=10)
    seconds = (started.ended[0] if started.ended else time.monotonic()) - started.started
    output = started.log.read_text(errors="replace")
    job_dir = started.jobs_dir / started.job_name
    trials = sorted(p.parent for p in job_dir.glob("*/result.json"))
    assert len(trials) == 1, f"expected one trial in {job_dir}, found {len(trials)}:\n{output[-3000:]}"
    tasks = sorted(started.tmp.glob(f"vero-{started.example}-*/{started.example}"))
    assert len(tasks) == 1, f"expected one compiled task under {started.tmp}, found {tasks}"
    return ExampleRun(
        example=started.example,
        agent=started.agent,
        returncode=started.process.returncode,
        output=output,
        job_dir=job_dir,
        trial_dir=trials[0],
        result=json.loads((trials[0] / "result.json").read_text()),
        task_dir=tasks[0],
        seconds=seconds,
    )


# --------------------------------------------------------------------------------------------
# hidden cases and image listings


@dataclass(frozen=True)
class HiddenCases:
    """What identifies the hidden (target) partitions' cases of an example.

    Attributes:
        names: the target partitions' case names.
        markers: sha256 -> `case/relative path` of every hidden case file (at least
            `MIN_MARKER_BYTES` long) whose content occurs in no agent-accessible case, the target
            or the reference: if a file with that content is in an image, a hidden case leaked.
        sizes: the byte sizes of the markers (only files of these sizes need hashing).
    """

    names: frozenset[str]
    markers: dict[str, str]
    sizes: frozenset[int]


def _file_digests(root: Path) -> dict[str, str]:
    return {
        hashlib.sha256(path.read_bytes()).hexdigest(): path.relative_to(root).as_posix()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def hidden_cases(example: str, task_dir: Path) -> HiddenCases:
    """The hidden cases of `tasks/<example>` and their content markers.

    The case names come from the spec; the hidden files are read from the compiled verifier context
    (`<task_dir>/tests/cases/<case>`, the exact bytes baked into the verifier image), the contents
    they must differ from from the spec's agent-accessible cases, target and reference.
    """
    spec = load_spec(build_spec_path(example))
    assert spec.cases.path is not None
    hidden = {case for partition in spec.targets for case in spec.cases.partitions[partition]}
    assert hidden, f"{example} has no hidden cases"
    visible = {case for partition in spec.agent_access for case in spec.cases.partitions[partition]}
    assert not hidden & visible
    known: set[str] = set()
    for case in visible:
        known |= set(_file_digests(spec.cases.path / case))
    for tree in (spec.target.path, spec.target.reference):
        if tree is not None and tree.is_dir():
            known |= set(_file_digests(tree))
        elif tree is not None:
            known.add(hashlib.sha256(tree.read_bytes()).hexdigest())
    markers: dict[str, str] = {}
    sizes: set[int] = set()
    for case in sorted(hidden):
        case_root = task_dir / "tests" / "cases" / case
        assert case_root.is_dir(), f"the compiled verifier context has no hidden case {case}"
        own = 0
        for digest, rel in _file_digests(case_root).items():
            size = (case_root / rel).stat().st_size
            if digest not in known and size >= MIN_MARKER_BYTES:
                markers[digest] = f"{case}/{rel}"
                sizes.add(size)
                own += 1
        assert own, f"hidden case {case} has no file whose content is unique to it: the check would be toothless"
    return HiddenCases(frozenset(hidden), markers, frozenset(sizes))


@dataclass
class ImageListing:
    """Every path in an image's filesystem, and the sha256 of the files whose size is in `sizes`."""

    image: str
    paths: set[str]
    digests: dict[str, str]
    """sha256 -> path, for files of the requested sizes."""


def list_image(image: str, sizes: Iterable[int] = ()) -> ImageListing:
    """`docker create` + `docker export` the image's filesystem and walk the tar stream.

    Raises:
        AssertionError: the container cannot be created or the export fails.
    """
    sizes = frozenset(sizes)
    created = subprocess.run(
        ["docker", "create", image, "/bin/true"], capture_output=True, text=True, timeout=120, check=False
    )
    assert created.returncode == 0, f"docker create {image}: {created.stderr}"
    container = created.stdout.strip()
    paths: set[str] = set()
    digests: dict[str, str] = {}
    try:
        export = subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert export.stdout is not None
        try:
            with tarfile.open(fileobj=export.stdout, mode="r|") as stream:
                for member in stream:
                    name = member.name.removeprefix("./").removeprefix("/").rstrip("/")
                    paths.add(name)
                    if member.isfile() and member.size in sizes:
                        handle = stream.extractfile(member)
                        assert handle is not None
                        digests[hashlib.sha256(handle.read()).hexdigest()] = name
        finally:
            export.stdout.close()
            stderr = export.stderr.read().decode(errors="replace") if export.stderr else ""
            export.wait(timeout=120)
        assert export.returncode == 0, f"docker export {image}: {stderr}"
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=120, check=False)
    return ImageListing(image, paths, digests)


def compose_build(compose_file: Path, project: str, env: dict[str, str], timeout_sec: float) -> None:
    """`docker compose -p <project> -f <file> build` (BuildKit's layer cache makes repeats cheap)."""
    done = subprocess.run(
        ["docker", "compose", "-p", project, "-f", str(compose_file), "build"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_sec,
        check=False,
    )
    assert done.returncode == 0, (
        f"docker compose build {compose_file} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def build_image(context: Path, tag: str, env: dict[str, str], timeout_sec: float) -> None:
    """Build `context`'s Dockerfile as `tag` through `compose_build`: BuildKit keeps its layer cache
    after `remove_images` (this engine's plain `docker build` is the legacy builder, whose cache is
    the intermediate images `docker rmi` deletes, so every run would build cold)."""
    compose_file = context.parent / f"{context.name}.build-compose.yaml"
    compose_file.write_text(json.dumps({"services": {"image": {"build": {"context": str(context)}, "image": tag}}}))
    project = "vero-build-" + hashlib.sha256(tag.encode()).hexdigest()[:12]
    compose_build(compose_file, project, env, timeout_sec)


def image_exists(image: str) -> bool:
    return (
        subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60, check=False).returncode
        == 0
    )


def remove_images(images: Iterable[str]) -> None:
    """Remove the images this test tagged (untags only, when another tag shares the image)."""
    for image in images:
        subprocess.run(["docker", "rmi", image], capture_output=True, timeout=120, check=False)
