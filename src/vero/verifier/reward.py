"""Harbor's reward file: what the verifier finally reports (docs/operating.md, "Verification").

Harbor 0.26 (`verifier/verifier.py`) reads `/logs/verifier/reward.json` as a flat JSON object of
finite numbers, one metric per key; a missing, empty or non-numeric file makes the trial's reward
invalid. vero therefore writes the file twice: failure values first (so a verifier killed half way
still reports a reward that can never beat a real measurement), then the measured values.

The file is replaced atomically with `vero.core.storage.atomic_write_bytes`: a rename over the path
replaces whatever directory entry sits there, so a symlink planted at `reward.json` is replaced,
never written through.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path

from vero.core.storage import atomic_write_bytes
from vero.spec.compiled import VerifierConfig

__all__ = ["failure_rewards", "reward_values", "write_reward_file"]


def failure_rewards(config: VerifierConfig) -> dict[str, float]:
    """The reward of a session that produced no measurement: every target at its failure value.

    Returns:
        reward key -> `config.failure_values[partition]`, for every target partition.

    The compiled spec guarantees the orientation: `minimize` specs must set a failure value no real
    measurement beats (validated in `vero.spec.validation`); `maximize` defaults to 0.0.
    """
    return {
        config.reward_keys[partition]: float(config.failure_values[partition]) for partition in sorted(config.targets)
    }


def reward_values(config: VerifierConfig, scores: Mapping[str, float | None]) -> dict[str, float]:
    """Map measured target scores to reward keys, failure values filling what was not measured.

    Args:
        config: the verifier config (`reward_keys`, `failure_values`).
        scores: target partition -> measured score, or None when the target could not be measured.
            Partitions missing from `scores` count as unmeasured; a non-finite score does too.

    Returns:
        reward key -> value, one entry per target partition.
    """
    rewards: dict[str, float] = {}
    for partition in sorted(config.targets):
        score = scores.get(partition)
        if score is None or not math.isfinite(score):
            score = config.failure_values[partition]
        rewards[config.reward_keys[partition]] = float(score)
    return rewards


def write_reward_file(path: str | Path, rewards: Mapping[str, float]) -> None:
    """Write Harbor's `reward.json` atomically, replacing (never following) whatever is at `path`.

    Args:
        path: the reward file, normally `/logs/verifier/reward.json`; its directory is created.
        rewards: reward key -> finite number (Harbor rejects NaN and infinities).

    Raises:
        ValueError: `rewards` is empty or holds a non-finite value (nothing is written).
        OSError: the directory cannot be written.
    """
    if not rewards:
        raise ValueError("a reward file needs at least one key")
    for key, value in rewards.items():
        if not math.isfinite(value):
            raise ValueError(f"reward {key!r} is not a finite number")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A real directory planted at the path would make the rename fail; remove it (rmtree does not
    # follow symlinks inside it). A symlink, even to a directory, is replaced by the rename itself.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    data = json.dumps({key: float(rewards[key]) for key in sorted(rewards)}, indent=2).encode() + b"\n"
    atomic_write_bytes(path, data, mode=0o644)
