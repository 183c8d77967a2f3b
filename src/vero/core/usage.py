"""Metered model usage of one evaluation, as the inference gateway counted it (never as claimed).

Token counts come from the upstream provider's `usage` (OpenAI `usage.prompt_tokens`/
`completion_tokens` or `input_tokens`/`output_tokens`, Anthropic `usage.input_tokens`/
`output_tokens` and cache fields), cost from the spec's prices (`vero.inference.pricing`).
`charged_micro_usd` is what the evaluation's budget was charged: equal to the metered cost, except
when a call cost more than its hold (only under a model's `unbounded_call_usd`, or a service tier
the provider chose itself: `overrun_usd`, recorded but never charged beyond the total).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["InferenceUsage", "ModelUsage"]


class ModelUsage(BaseModel):
    """Usage of one allow-listed model."""

    model_config = ConfigDict(extra="forbid")
    calls: int = 0
    input_tokens: int = 0
    """Uncached input tokens."""
    cached_input_tokens: int = 0
    """Input tokens read from (or written to) the provider's prompt cache."""
    output_tokens: int = 0
    cost_usd: float = 0.0


class InferenceUsage(BaseModel):
    """Everything the gateway counted for one evaluation's token."""

    model_config = ConfigDict(extra="forbid")
    calls: int = 0
    """Calls forwarded upstream and charged: answered (metered), or taken by the provider and never
    answered (charged their hold, also counted in `failed_calls` and `unmetered_calls`)."""
    refused_calls: dict[str, int] = Field(default_factory=dict)
    """Reason (`model_not_allowed`, `unbounded_request`, `over_budget`, `budget_exhausted`,
    `bad_request`, `foreign_token`, `too_many_connections` (a connection past the caps of
    `vero.inference.connections`), ...) -> calls refused before reaching the provider."""
    failed_calls: int = 0
    """Calls the provider failed (5xx, timeout, connection). 5xx and connection failures are not
    charged; a call the provider took and never answered is charged its hold (it may be billed)."""
    unreachable_calls: int = 0
    """Of `failed_calls`, those that never reached the provider (no connection could be made, or
    its URL cannot be called). In the verifier a measurement with any is unmeasured
    (`unreachable_failure`); the sidecar charges it as measured, since whether to call is the
    candidate's choice (`vero.core.run.EvaluationLease.charged`)."""
    unmetered_calls: int = 0
    """Calls charged without usage figures (no usage in the answer, a stream cut off, a call never
    answered): charged what was held for them, their bound."""
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    """Metered cost at the spec's prices (US dollars)."""
    charged_micro_usd: int = 0
    """What the budget was charged (micro-dollars)."""
    overrun_usd: float = 0.0
    """Metered cost above what could be charged (a call that ran past the budget's end)."""
    by_model: dict[str, ModelUsage] = Field(default_factory=dict)

    @property
    def n_refused(self) -> int:
        return sum(self.refused_calls.values())

    @classmethod
    def combine(cls, usages: list[InferenceUsage]) -> InferenceUsage:
        """The sum of several evaluations' usage (per model too)."""
        total = cls()
        for usage in usages:
            total.calls += usage.calls
            for reason, n in usage.refused_calls.items():
                total.refused_calls[reason] = total.refused_calls.get(reason, 0) + n
            total.failed_calls += usage.failed_calls
            total.unreachable_calls += usage.unreachable_calls
            total.unmetered_calls += usage.unmetered_calls
            total.input_tokens += usage.input_tokens
            total.cached_input_tokens += usage.cached_input_tokens
            total.output_tokens += usage.output_tokens
            total.cost_usd += usage.cost_usd
            total.charged_micro_usd += usage.charged_micro_usd
            total.overrun_usd += usage.overrun_usd
            for name, model in usage.by_model.items():
                mine = total.by_model.setdefault(name, ModelUsage())
                mine.calls += model.calls
                mine.input_tokens += model.input_tokens
                mine.cached_input_tokens += model.cached_input_tokens
                mine.output_tokens += model.output_tokens
                mine.cost_usd += model.cost_usd
        return total

    def unreachable_failure(self) -> str | None:
        """Why this evaluation measured nothing, when some model call never reached its provider.

        Such an evaluation is an infrastructure failure (refunded in the sidecar, unmeasured in
        the verifier): a case's grader or a candidate that could not reach its model scores the
        provider's absence, and reading it as a score would be a wrong number nobody is told about.
        """
        if not self.unreachable_calls:
            return None
        return (
            f"{self.unreachable_calls} model call(s) through the inference gateway could not reach the "
            "provider (see the gateway's log lines for the error; check inference.providers.*.base_url)"
        )
