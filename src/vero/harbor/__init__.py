"""Nested `harbor run`, and vero's other uses of Harbor: the one package that imports it besides the
compiler's task check (`tests/core/test_imports.py`; docs/architecture.md, "Nested runs").

Public names: `HarborBackend` (the real `vero.core.run.EvaluationBackend`: the contract, `NestedRun`
and `RunAs` live in `vero.core.run`), `runner_identity` (the `RunAs` of the unprivileged
`RUNNER_USER`, for the sidecar and the verifier), and the building blocks other code may reuse:
`build_command`, `collate_job`, `TrialOutcome`, `INSTALL_AGENT_IMPORT_PATH`. Importing this package does not import
Harbor; Harbor loads when a run is built, read or started.
"""

from vero.harbor.command import INSTALL_AGENT_IMPORT_PATH, HarborCommand, build_command
from vero.harbor.process import RUNNER_USER, runner_identity
from vero.harbor.results import INFRASTRUCTURE_EXCEPTION_TYPES, JobCollation, TrialOutcome, collate_job
from vero.harbor.runner import HarborBackend

__all__ = [
    "INFRASTRUCTURE_EXCEPTION_TYPES",
    "INSTALL_AGENT_IMPORT_PATH",
    "RUNNER_USER",
    "HarborBackend",
    "HarborCommand",
    "JobCollation",
    "TrialOutcome",
    "build_command",
    "collate_job",
    "runner_identity",
]
