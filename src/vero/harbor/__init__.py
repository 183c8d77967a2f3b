"""Nested `harbor run`, and vero's other uses of Harbor: the one package that imports it besides the
compiler's task check (`tests/core/test_imports.py`; docs/architecture.md, "Nested runs").

Public names: `HarborBackend` (the real `vero.core.run.EvaluationBackend`: the contract, `NestedRun`
and `RunAs` live in `vero.core.run`), `runner_identity` (the `RunAs` of the unprivileged
`RUNNER_USER`, for the sidecar and the verifier), and the building blocks other code may reuse:
`build_command`, `collate_job`, `TrialOutcome`, `INSTALL_AGENT_IMPORT_PATH`. Importing this package does not import
Harbor, nor any of its modules: each public name loads its module on first use (PEP 562), because
every candidate host process (`python -m vero.harbor.boundary.host`) imports this package first and
needs none of it (importing the modules here cost each host about 150 ms of CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vero._lazy import lazy_exports

if TYPE_CHECKING:
    from vero.harbor.command import INSTALL_AGENT_IMPORT_PATH, HarborCommand, build_command
    from vero.harbor.process import RUNNER_USER, runner_identity
    from vero.harbor.results import INFRASTRUCTURE_EXCEPTION_TYPES, JobCollation, TrialOutcome, collate_job
    from vero.harbor.runner import HarborBackend

_MODULE_OF = {
    "INFRASTRUCTURE_EXCEPTION_TYPES": "vero.harbor.results",
    "INSTALL_AGENT_IMPORT_PATH": "vero.harbor.command",
    "RUNNER_USER": "vero.harbor.process",
    "HarborBackend": "vero.harbor.runner",
    "HarborCommand": "vero.harbor.command",
    "JobCollation": "vero.harbor.results",
    "TrialOutcome": "vero.harbor.results",
    "build_command": "vero.harbor.command",
    "collate_job": "vero.harbor.results",
    "runner_identity": "vero.harbor.process",
}

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


__getattr__ = lazy_exports(__name__, _MODULE_OF)
