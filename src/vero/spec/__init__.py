"""The optimization spec (`build.yaml`): models, loading and validation (docs/spec.md)."""

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
