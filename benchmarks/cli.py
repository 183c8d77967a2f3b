"""Every `vero` call's start-up against `python -c pass`, side by side in one run.

Run from the repository root: `uv run python benchmarks/cli.py` (about a minute here). In
alternating rounds it runs, each as a fresh process of this venv's interpreter with output into
/dev/null (a pipe, as an agent's tool call has it): `python -c pass`, the `vero` console script
with `--help`, `harbor --help` and every command's `--help` (`harbor build --help`, ...,
`harbor status --help`, ..., `report --help`); with `--baseline-src DIR` (e.g. a main checkout's
`src`) the same calls with vero imported from there, in the same rounds. It prints medians of CPU
(user + system) and wall milliseconds and each call's CPU over `python -c pass`'s. No assertion:
docs/benchmarks.md records the figures (the goal is at most 3x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.growth import _cpu_ms
from vero.commands.registry import COMMANDS

CALLS = (
    ("--help",),
    ("harbor", "--help"),
    *(((e.group, e.name, "--help") if e.group else (e.name, "--help")) for e in COMMANDS),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--baseline-src", type=Path, default=None, help="also run vero from this src")
    args = parser.parse_args()
    # Bytecode is cached as on an operator's machine (this shell may say not to).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(HARBOR_TELEMETRY="0", LITELLM_LOCAL_MODEL_COST_MAP="True")
    script = str(Path(sys.executable).with_name("vero"))
    commands: dict[str, tuple[list[str], dict[str, str]]] = {"python -c pass": ([sys.executable, "-c", "pass"], env)}
    for call in CALLS:
        commands[f"vero {' '.join(call)}"] = ([script, *call], env)
        if args.baseline_src is not None:
            base_env = {**env, "PYTHONPATH": str(args.baseline_src.resolve())}
            commands[f"vero {' '.join(call)} (baseline)"] = ([script, *call], base_env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for round_number in range(args.rounds + 1):
        for name, (argv, cmd_env) in commands.items():
            measured = _cpu_ms(argv, cmd_env)
            if round_number:  # the first round warms the caches (bytecode, page cache)
                samples[name].append(measured)
    floor = statistics.median(cpu for _, cpu in samples["python -c pass"])
    print(f"medians of {args.rounds} alternating rounds (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")
    for name, rows in samples.items():
        wall = statistics.median(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        print(f"  {name:<40} CPU {cpu:6.1f} ms, wall {wall:6.1f} ms, CPU / python -c pass {cpu / floor:5.2f}")


if __name__ == "__main__":
    main()
