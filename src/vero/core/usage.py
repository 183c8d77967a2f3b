"""Metered model usage of one evaluation, as the inference gateway counted it (never as claimed).

Token counts come from the upstream provider's `usage` (OpenAI `usage.prompt_tokens`/
`completion_tokens` or `input_tokens`/`output_tokens`, Anthropic `usage.input_tokens`/
`output_tokens` and cache fields), cost from the spec's prices (`vero.inference.pricing`).
`charged_micro_usd` is what the evaluation's budget was charged: equal to the metered cost, except
when one call ran past what was left (`overrun_usd`, recorded but never charged beyond the total).
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
    """Calls forwarded upstream that returned a response (metered)."""
    refused_calls: dict[str, int] = Field(default_factory=dict)
    """Reason (`model_not_allowed`, `budget_exhausted`, `bad_request`, ...) -> calls refused before
    reaching the provider."""
    failed_calls: int = 0
    """Calls the provider failed (5xx, timeout, connection); not charged."""
    unmetered_calls: int = 0
    """Responses without usage figures: charged what was held for them (the worst case)."""
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

    def totals(self) -> InferenceUsage:
        """The same usage without the per-model breakdown (what `aggregate` disclosure shows)."""
        return self.model_copy(update={"by_model": {}})
