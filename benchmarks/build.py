"""`vero harbor build` against importing what it needs, side by side in one run.

Run from the repository root: `uv run python benchmarks/build.py` (a minute or two here). In
alternating rounds it runs, each as a fresh process of this venv's interpreter:

- `python -c "import harbor.models.task.config"` (Harbor's task models, which the compiler
  validates every case and the task against) and `python -c "import harbor.trial.trial"` (Harbor's
  trial, which check 3 of the case checks sets every case up with);
- `vero harbor build` of each example under `tasks/` (a fresh output directory each round);
- the case checks of each example's cases alone (`python -m vero.harbor.case_checks docker
  tasks/<example>/cases <every case>`: checks 1-3 in a fresh process, as the nested-run backend runs
  them), to show what the checks, mostly check 3's Harbor trial, cost of a build;
- with `--baseline-src DIR` (e.g. `/work/main/src`), the same builds with vero imported from that
  checkout (`python -m vero._entry`), so a change is compared with its base in the same rounds;
- with `--check-shares`, each build twice more with `vero.harbor.case_checks.check_cases` replaced in
  the build's process: without check 3 (`setup=False`) and without any case check, to show what a
  build would cost without them (the replacement imports `vero.harbor.case_checks` first, a few ms).

It prints medians of CPU (user + system of the process and its children) and wall milliseconds,
each build's ratio to the task models' import, the tarball's size and how many copies of the
vero wheel it stores, and, with a baseline, whether both builds' tarballs hold the same entries and
bytes but for the wheel (whose bytes are the two checkouts' sources). Builds share the per-user
cache (`$XDG_CACHE_HOME/vero`: the compressed tarball and the compiled templates), so all but the
first round rebuild a cached task, as `vero harbor run` and repeated builds do; `--cold` gives every
build an empty cache instead. No assertion: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.growth import _cpu_ms

EXAMPLES = ("minimal", "c-matmul", "puzzle-agent")

WITHOUT_CHECKS = """
import functools, sys
import vero.harbor.case_checks as checks
without = sys.argv.pop(1)
checks.check_cases = (
    functools.partial(checks.check_cases, setup=False) if without == "check 3" else lambda *_a, **_k: []
)
from vero._entry import main
main()
"""
"""`python -c` program: `vero` with the case checks replaced (argv: "check 3" or "case checks", then
vero's arguments)."""


def _wheel_copies(tarball: Path) -> int:
    with tarfile.open(tarball) as tar:
        return sum(1 for m in tar.getmembers() if m.name.endswith(".whl") and m.isfile())


def _same_but_the_wheel(ours: Path, theirs: Path) -> bool:
    """Whether two tarballs list the same entries with the same bytes, the vero wheel aside."""

    def entries(path: Path) -> list[tuple[str, int, str, bytes | None]]:
        with tarfile.open(path) as tar:
            return [
                (m.name, m.mode, m.linkname, None if m.name.endswith(".whl") or not m.isfile() else _read(tar, m))
                for m in tar.getmembers()
            ]

    return entries(ours) == entries(theirs)


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    assert handle is not None
    return handle.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-src", type=Path, default=None, help="also build with vero from this src")
    parser.add_argument("--cold", action="store_true", help="an empty per-user cache for every build")
    parser.add_argument("--check-shares", action="store_true", help="also build without check 3 / any case check")
    args = parser.parse_args()
    # Bytecode is cached as on an operator's machine (this shell may say not to).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True")
    python = sys.executable
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "import harbor.models.task.config": ([python, "-c", "import harbor.models.task.config"], env),
        "import harbor.trial.trial": ([python, "-c", "import harbor.trial.trial"], env),
    }
    with tempfile.TemporaryDirectory(prefix="vero-build-bench-") as tmp:
        out = Path(tmp)
        for example in EXAMPLES:
            spec = str(ROOT / "tasks" / example / "build.yaml")
            build = ["harbor", "build", "--config", spec, "--force", "--output"]
            commands[f"build {example}"] = ([python, "-m", "vero._entry", *build, str(out / example)], env)
            cases = ROOT / "tasks" / example / "cases"
            checks = [python, "-m", "vero.harbor.case_checks", "docker", str(cases), *sorted(os.listdir(cases))]
            commands[f"case checks {example}"] = (checks, env)
            if args.check_shares:
                for without in ("check 3", "case checks"):
                    target = str(out / f"{example}-without-{without.replace(' ', '-')}")
                    commands[f"build {example} without {without}"] = (
                        [python, "-c", WITHOUT_CHECKS, without, *build, target],
                        env,
                    )
            if args.baseline_src is not None:
                base_env = {**env, "PYTHONPATH": str(args.baseline_src.resolve())}
                commands[f"build {example} (baseline)"] = (
                    [python, "-m", "vero._entry", *build, str(out / f"{example}-base")],
                    base_env,
                )
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for round_number in range(args.rounds + 1):
            for name, (argv, cmd_env) in commands.items():
                if args.cold:
                    cmd_env = {**cmd_env, "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="cache-", dir=tmp)}
                measured = _cpu_ms(argv, cmd_env)
                if round_number:  # the first round warms the caches (bytecode, page cache)
                    samples[name].append(measured)
        models_cpu = statistics.median(cpu for _, cpu in samples["import harbor.models.task.config"])
        trial_cpu = statistics.median(cpu for _, cpu in samples["import harbor.trial.trial"])
        print(
            f"medians of {args.rounds} alternating rounds (load average {os.getloadavg()[0]:.1f}, "
            f"{os.cpu_count()} CPUs)"
        )
        for name, rows in samples.items():
            wall = statistics.median(w for w, _ in rows)
            cpu = statistics.median(c for _, c in rows)
            line = (
                f"  {name:<36} CPU {cpu:7.0f} ms, wall {wall:7.0f} ms, "
                f"CPU / task models {cpu / models_cpu:5.2f}, / trial {cpu / trial_cpu:5.2f}"
            )
            if name.startswith("build ") and " without " not in name:
                target = name.split()[1] + ("-base" if name.endswith("(baseline)") else "")
                tarball = out / f"{target}.tar.gz"
                line += f", tarball {tarball.stat().st_size / 1e6:.2f} MB, wheel stored {_wheel_copies(tarball)}x"
                if name.endswith("(baseline)"):
                    same = _same_but_the_wheel(out / f"{name.split()[1]}.tar.gz", tarball)
                    line += f", same entries and bytes as this checkout's but the wheel: {'yes' if same else 'NO'}"
            print(line)


if __name__ == "__main__":
    main()
