"""The optimization spec (`build.yaml`): models, loading and validation (docs/spec.md).

Importing this package imports none of its modules: each public name loads its module on first use
(PEP 562), so code that needs one model module (the served sidecar, through `vero.spec.models`)
does not pay for the spec's YAML loading (PyYAML) as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vero._lazy import lazy_exports

if TYPE_CHECKING:
    from vero.errors import SpecError, SpecIssue
    from vero.spec.loading import load_spec, parse_spec
    from vero.spec.models import (
        AgentTarget,
        CandidateRuntime,
        CasesSpec,
        Direction,
        Disclosure,
        HarborSpec,
        ImagesSpec,
        LadderSpec,
        OptimizationSpec,
        PartitionAccess,
        ProgramTarget,
        ScoringSpec,
        SelectionSpec,
        TargetPartition,
    )

_MODULE_OF = {
    "SpecError": "vero.errors",
    "SpecIssue": "vero.errors",
    "load_spec": "vero.spec.loading",
    "parse_spec": "vero.spec.loading",
    "AgentTarget": "vero.spec.models",
    "CandidateRuntime": "vero.spec.models",
    "CasesSpec": "vero.spec.models",
    "Direction": "vero.spec.models",
    "Disclosure": "vero.spec.models",
    "HarborSpec": "vero.spec.models",
    "ImagesSpec": "vero.spec.models",
    "LadderSpec": "vero.spec.models",
    "OptimizationSpec": "vero.spec.models",
    "PartitionAccess": "vero.spec.models",
    "ProgramTarget": "vero.spec.models",
    "ScoringSpec": "vero.spec.models",
    "SelectionSpec": "vero.spec.models",
    "TargetPartition": "vero.spec.models",
}

__all__ = [
    "AgentTarget",
    "CandidateRuntime",
    "CasesSpec",
    "Direction",
    "Disclosure",
    "HarborSpec",
    "ImagesSpec",
    "LadderSpec",
    "OptimizationSpec",
    "PartitionAccess",
    "ProgramTarget",
    "ScoringSpec",
    "SelectionSpec",
    "SpecError",
    "SpecIssue",
    "TargetPartition",
    "load_spec",
    "parse_spec",
]

__getattr__ = lazy_exports(__name__, _MODULE_OF)
