"""Every failure vero reports, as one exception tree.

```
VeroError
├── SpecError                 build.yaml (or an option naming build inputs) is invalid; carries the
│                             YAML path or `--option` (`loc`) and what was expected
├── PolicyDenied              the visibility policy refuses the request (unknown partition, floor, closed)
├── BudgetExhausted           a reservation would exceed a (partition, principal) total
├── UnknownJob                no evaluation job with that id
├── Conflict                  the request conflicts with state (submit disabled, session sealed, ...)
├── CandidateRejected         a version cannot be imported (malformed, unknown, unsafe tree)
├── RequestInvalid            the sidecar refused a request's shape (HTTP 422): a usage error
├── InfrastructureFailure     the evaluation could not measure anything (build, engine, timeout); refunded
├── LedgerCorrupt             the persisted budget ledger (or another durable record) cannot be read
├── SessionInvalid            a sealed session archive fails its digest or spec-digest check
└── SidecarUnavailable        the agent-side client could not reach the sidecar
```

Core code raises these and nothing HTTP-shaped; `vero.sidecar.errors` alone maps them to status
codes, and the agent client maps problem bodies back to the same classes. Callers decide by type,
never by message text. Messages never carry secret values or hidden partition names.
"""

from __future__ import annotations

__all__ = [
    "BudgetExhausted",
    "CandidateRejected",
    "Conflict",
    "InfrastructureFailure",
    "LedgerCorrupt",
    "PolicyDenied",
    "RequestInvalid",
    "SessionInvalid",
    "SidecarUnavailable",
    "SpecError",
    "SpecIssue",
    "UnknownJob",
    "VeroError",
]

from dataclasses import dataclass


class VeroError(Exception):
    """Root of every error vero raises on purpose."""


@dataclass(frozen=True)
class SpecIssue:
    """One problem in an optimization spec.

    Attributes:
        loc: dotted YAML path of the offending field, e.g. ``agent_access.train.disclosure``
            (``<root>`` for the document itself), or a command-line option such as ``--output``.
        message: what was expected there.
    """

    loc: str
    message: str

    def __str__(self) -> str:
        return self.message if self.loc == "<root>" else f"{self.loc}: {self.message}"


class SpecError(VeroError):
    """The optimization spec (or a compiled role config, or an option naming build inputs) is invalid.

    Attributes:
        issues: every problem found, each with its YAML path (or `--option`).
        source: the spec file, when known.
    """

    def __init__(self, issues: list[SpecIssue] | SpecIssue, source: str | None = None):
        self.issues = [issues] if isinstance(issues, SpecIssue) else list(issues)
        self.source = source
        super().__init__(self.render())

    @classmethod
    def at(cls, loc: str, message: str, source: str | None = None) -> SpecError:
        """Shorthand for a single issue at ``loc``."""
        return cls(SpecIssue(loc, message), source)

    def render(self) -> str:
        """A head line, then one `  - loc: message` line per issue.

        The head says `invalid command-line option` when every issue names an option (`--agent`,
        `--output`, ...), else `invalid spec` and the file.
        """
        if self.issues and all(issue.loc.startswith("--") for issue in self.issues):
            head = "invalid command-line option"
        else:
            head = f"invalid spec {self.source}" if self.source else "invalid spec"
        return head + "\n" + "\n".join(f"  - {issue}" for issue in self.issues)


class PolicyDenied(VeroError):
    """The split-visibility policy refuses the request (fail closed).

    The message is safe to show the agent: it never names a partition the agent may not use.
    """


class BudgetExhausted(VeroError):
    """A reservation would exceed a budget total.

    Attributes:
        partition: partition whose budget is exhausted (None when rebuilt from a message).
        principal: who asked (``agent`` for the coding agent; None when rebuilt from a message).
        resource: ``runs`` or ``cases`` (None when rebuilt from a message).
        requested: amount the reservation needed (None when rebuilt from a message).
        remaining: amount still available (None when rebuilt from a message).
    """

    partition: str | None
    principal: str | None
    resource: str | None
    requested: int | None
    remaining: int | None

    def __init__(self, partition: str, principal: str, resource: str, requested: int, remaining: int):
        self.partition = partition
        self.principal = principal
        self.resource = resource
        self.requested = requested
        self.remaining = remaining
        super().__init__(
            f"budget exhausted for partition {partition!r}: {resource} requested {requested}, "
            f"remaining {remaining}"
        )

    @classmethod
    def from_message(cls, message: str) -> BudgetExhausted:
        """A `BudgetExhausted` whose figures are unknown, e.g. rebuilt by the agent-side client
        from an HTTP 402 problem body (which carries text only). Every figure attribute is None.
        """
        error = cls.__new__(cls)
        error.partition = error.principal = error.resource = None
        error.requested = error.remaining = None
        Exception.__init__(error, message)
        return error


class UnknownJob(VeroError):
    """No evaluation job with the given id exists."""


class Conflict(VeroError):
    """The request conflicts with the current state (e.g. submissions disabled, session sealed)."""


class CandidateRejected(VeroError):
    """A version cannot become a candidate: malformed, unknown, or its tree is unsafe."""


class RequestInvalid(VeroError):
    """The sidecar refused the shape of a request (HTTP 422: unknown field, wrong type, value out
    of range). A usage error of the caller, not a policy decision."""


class InfrastructureFailure(VeroError):
    """The evaluation produced no measurement for infrastructure reasons; its budget is refunded."""


class LedgerCorrupt(VeroError):
    """A durable record (budget ledger, job index) exists but cannot be read or validated."""


class SessionInvalid(VeroError):
    """A sealed session archive fails its digest, spec-digest or structure checks."""


class SidecarUnavailable(VeroError):
    """The agent-side client could not reach the sidecar (connection refused, DNS, timeouts)."""
