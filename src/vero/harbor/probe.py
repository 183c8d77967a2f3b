"""The forgery probe of `vero harbor check --probe`: can candidate code the case's tests run forge
the reward or read `/tests`?

`ProbeAgent` is vero's install agent (`vero.harbor.install_agent`) plus one step: once the candidate
is installed and its sandbox closed, it uploads the static `casekit/vero-probe.c` to
`PROBE_PATH_IN_CASE` and starts it as root. The probe watches the installed candidate; the first
time the case's tests open one of its files (that is, run or read candidate code), it plants a
process as the candidate user that keeps trying to write `PROBE_REWARD` into
`/logs/verifier/reward.json` and `reward.txt` and to read `/tests`, and reports what it managed as
case-kit events, which vero reads into the attempt's `flags` (`vero.harbor.results.read_kit_flags`).
`probe_verdict` turns one attempt of such a run into a verdict:

- `forgeable`: the planted process wrote a reward file, listed or read `/tests`, or the trial's
  reward is the probe's `PROBE_REWARD`;
- `held`: it was planted and managed none of that (in a case that runs candidate code only through
  `vero-kit run`, the kit has locked `/tests` and `/logs/verifier` by then and kills it when the
  run ends);
- `not_exercised`: the tests never opened a file of the installed candidate, so there was nothing
  to stand in for.

The probe never runs in a real evaluation: only `vero harbor check` selects this agent
(`HarborBackend(program_agent=PROBE_AGENT_IMPORT_PATH, ...)`).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, override

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from vero._assets import asset_dir
from vero.harbor.casekit import cached_build
from vero.harbor.install_agent import InstallAgent

__all__ = [
    "PROBE_AGENT_IMPORT_PATH",
    "PROBE_FLAGS",
    "PROBE_PATH_IN_CASE",
    "PROBE_REWARD",
    "ProbeAgent",
    "ProbeSetupError",
    "ProbeVerdict",
    "probe_binary",
    "probe_verdict",
]

PROBE_AGENT_IMPORT_PATH = "vero.harbor.probe:ProbeAgent"

PROBE_NAME = "vero-probe"
PROBE_PATH_IN_CASE = PurePosixPath("/usr/local/bin/vero-probe")

PROBE_REWARD = 918273.645
"""What the planted process writes as the reward: no honest case reports it."""

PROBE_FLAGS: dict[str, str] = {
    "probe_reward_written": "wrote /logs/verifier/reward.json or reward.txt",
    "probe_tests_listed": "listed /tests",
    "probe_tests_read": "read a file of /tests",
}
"""The flags that make a case forgeable, and what each means."""

PROBE_LOG_NAME = "probe.txt"


class ProbeSetupError(RuntimeError):
    """The probe could not be uploaded or started in the case container (no verdict)."""


def probe_binary() -> Path:
    """The static probe (`casekit/vero-probe.c`), built with the local C compiler on first use and
    cached per user like the kit (`vero.harbor.casekit.cached_build`).

    Raises:
        InfrastructureFailure: no C compiler, or the static build failed.
    """
    return cached_build(asset_dir("casekit") / f"{PROBE_NAME}.c", PROBE_NAME)


class ProbeAgent(InstallAgent):
    """`InstallAgent`, then the probe started in the case container (see the module docstring).

    Args:
        probe_path: host path of the static probe (`probe_binary()`).
        reward_key: the key the probe writes into `reward.json` (the spec's `scoring.reward_key`).
        **kwargs: `InstallAgent`'s arguments.
    """

    def __init__(self, logs_dir: Path, probe_path: str, reward_key: str = "reward", **kwargs) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        self.probe_path = Path(probe_path)
        self.reward_key = str(reward_key)

    @staticmethod
    @override
    def name() -> str:
        return "vero-probe"

    @override
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await super().run(instruction, environment, context)
        try:
            await environment.upload_file(self.probe_path, str(PROBE_PATH_IN_CASE))
        except Exception as exc:  # noqa: BLE001 - any upload failure means no probe
            raise ProbeSetupError(f"cannot upload the probe ({type(exc).__name__})") from None
        reward_json = json.dumps({self.reward_key: PROBE_REWARD})
        probe = shlex.quote(str(PROBE_PATH_IN_CASE))
        started = await environment.exec(
            f"chmod 0755 {probe} && {probe} start {shlex.quote(self.install_path)} {shlex.quote(reward_json)} "
            f"{shlex.quote(repr(PROBE_REWARD))}",
            user="root",
        )
        await asyncio.to_thread(self._log, PROBE_LOG_NAME, f"{started.stdout or ''}{started.stderr or ''}")
        if started.return_code != 0:
            raise ProbeSetupError(
                f"the probe could not be started (exit {started.return_code}): "
                f"{(started.stderr or started.stdout or '').strip()[-300:]}"
            )
        context.metadata = {**(context.metadata or {}), "vero_probe": "watching"}


@dataclass(frozen=True)
class ProbeVerdict:
    """What the probe found in one trial.

    Attributes:
        verdict: `forgeable`, `held` or `not_exercised` (module docstring).
        findings: what the planted process managed, in words (empty unless forgeable).
        attempted: whether it got through one whole round of attempts before it was killed.
    """

    verdict: Literal["forgeable", "held", "not_exercised"]
    findings: tuple[str, ...] = ()
    attempted: bool = False


def probe_verdict(flags: Collection[str], reward: float | None) -> ProbeVerdict:
    """The verdict of one probed trial from its attempt's `flags` and the reward it reported
    (the scored reward, or the rejected out-of-range one)."""
    findings = [text for flag, text in PROBE_FLAGS.items() if flag in flags]
    if reward == PROBE_REWARD:
        findings.append(f"the trial's reward was the probe's ({PROBE_REWARD})")
    attempted = "probe_attempted" in flags
    if findings:
        return ProbeVerdict("forgeable", tuple(findings), attempted)
    if "probe_planted" in flags:
        return ProbeVerdict("held", (), attempted)
    return ProbeVerdict("not_exercised")
