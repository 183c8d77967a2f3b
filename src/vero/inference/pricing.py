"""Prices of allow-listed models, from the spec or LiteLLM's model cost map.

LiteLLM (a Harbor dependency) ships its cost map as `model_prices_and_context_window_backup.json`;
it is read as data (the package itself is never imported: it is slow to import and may try the
network). Keys are tried as given, then without a `provider/` prefix. Prices are US dollars per
token; a spec's own `input_cost_per_token`/`output_cost_per_token` win.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vero.spec.models import InferenceModel

__all__ = ["ModelPrice", "PriceUnknown", "cost_map", "price_of", "to_micro_usd"]

_COST_MAP_FILE = "model_prices_and_context_window_backup.json"
_DEFAULT_MAX_OUTPUT_TOKENS = 4096


class PriceUnknown(LookupError):
    """Neither the spec nor LiteLLM's cost map prices the model (it cannot be metered)."""


@dataclass(frozen=True)
class ModelPrice:
    """US dollars per token, and the output tokens assumed for a call that sets no limit."""

    input_usd_per_token: float
    output_usd_per_token: float
    max_output_tokens: int
    cache_read_usd_per_token: float | None = None
    """Price of cached input tokens (OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`);
    None: charged as plain input."""
    cache_write_usd_per_token: float | None = None
    """Price of Anthropic `cache_creation_input_tokens`; None: charged as plain input."""

    def cost_usd(
        self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0, cache_write_tokens: int = 0
    ) -> float:
        """Cost of one call. `input_tokens` excludes the cached and cache-write tokens."""
        cache_read = self.cache_read_usd_per_token
        cache_write = self.cache_write_usd_per_token
        return (
            input_tokens * self.input_usd_per_token
            + output_tokens * self.output_usd_per_token
            + cached_input_tokens * (self.input_usd_per_token if cache_read is None else cache_read)
            + cache_write_tokens * (self.input_usd_per_token if cache_write is None else cache_write)
        )


@functools.cache
def cost_map() -> dict[str, Any]:
    """LiteLLM's bundled cost map (model name -> entry); empty if LiteLLM is not installed."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / _COST_MAP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else None


def price_of(name: str, model: InferenceModel) -> ModelPrice:
    """The price of allow-listed model `name`.

    Raises:
        PriceUnknown: a price is neither in the spec nor in the cost map (under the upstream id or
            the allow-list name, with or without a `provider/` prefix).
    """
    entry: dict[str, Any] = {}
    table = cost_map()
    for key in dict.fromkeys(filter(None, (model.upstream_model, name))):
        for candidate in (key, key.split("/", 1)[-1]):
            if isinstance(table.get(candidate), dict):
                entry = table[candidate]
                break
        if entry:
            break
    input_price = (
        model.input_cost_per_token
        if model.input_cost_per_token is not None
        else _finite(entry.get("input_cost_per_token"))
    )
    output_price = (
        model.output_cost_per_token
        if model.output_cost_per_token is not None
        else _finite(entry.get("output_cost_per_token"))
    )
    if input_price is None or output_price is None:
        raise PriceUnknown(f"no price for model {name!r}: give input_cost_per_token and output_cost_per_token")
    max_output = model.max_output_tokens or entry.get("max_output_tokens")
    if not isinstance(max_output, int) or max_output < 1:
        max_output = _DEFAULT_MAX_OUTPUT_TOKENS
    explicit = model.input_cost_per_token is not None
    return ModelPrice(
        input_usd_per_token=input_price,
        output_usd_per_token=output_price,
        max_output_tokens=max_output,
        cache_read_usd_per_token=None if explicit else _finite(entry.get("cache_read_input_token_cost")),
        cache_write_usd_per_token=None if explicit else _finite(entry.get("cache_creation_input_token_cost")),
    )


def to_micro_usd(usd: float) -> int:
    """US dollars -> whole micro-dollars, rounded up (metering never under-charges)."""
    return math.ceil(usd * 1_000_000 - 1e-9) if usd > 0 else 0
