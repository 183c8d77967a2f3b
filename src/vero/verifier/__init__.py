"""The verifier: selection, final scoring, Harbor's reward file and the operator artifacts (docs/operating.md).

`verify` is the whole verification (`vero harbor verify` calls it); the submodules hold one concept
each: `selection` (which candidate ships), `scoring` (the verifier's own nested runs), `reward`
(`reward.json`), `artifacts` (`finalization.json`, `status.json`, the session copy) and `report`
(`experiment.html`). Harbor itself is only reached through the `EvaluationBackend` the caller passes.
"""

from vero.verifier._verify import RebuiltBaseline, VerifierPaths, rebuild_baseline, verify
from vero.verifier.artifacts import Finalization, SessionStatus, build_status
from vero.verifier.report import render_report, write_report
from vero.verifier.reward import failure_rewards, reward_values, write_reward_file
from vero.verifier.scoring import Scorer, resolve_run_as
from vero.verifier.selection import Measurement, Selection, select_candidate

__all__ = [
    "Finalization",
    "Measurement",
    "RebuiltBaseline",
    "Scorer",
    "Selection",
    "SessionStatus",
    "VerifierPaths",
    "build_status",
    "failure_rewards",
    "rebuild_baseline",
    "render_report",
    "resolve_run_as",
    "reward_values",
    "select_candidate",
    "verify",
    "write_report",
    "write_reward_file",
]
