"""Prices of allow-listed models as the provider bills them, from the spec or LiteLLM's cost map.

LiteLLM (a Harbor dependency) ships its cost map as `model_prices_and_context_window_backup.json`;
it is read as data (the package itself is never imported: it is slow to import and may try the
network). Keys are tried as given, then without a `provider/` prefix. Prices are US dollars per
token. What the map says, and how it is read here:

- **Service tiers**: `<rate>_<tier>` (`input_cost_per_token_priority`, `..._flex`): a call sent
  with `service_tier: <tier>` is priced at them; a tier the map does not price is refused by the
  gateway (`ModelPrice.tiers`).
- **Context-size tiers**: `<rate>_above_<N>k_tokens[_<tier>]`: a call whose prompt (input, cached
  and cache-write tokens together) is over N thousand tokens pays these rates for all its tokens,
  as LiteLLM and the providers price it (gpt-5.4 above 272k, Gemini above 200k). A service tier
  without a context rate of its own pays its base rate scaled by the standard tier's context ratio.
- **Cache writes**: `cache_creation_input_token_cost` (five minutes) and
  `cache_creation_input_token_cost_above_1hr` (Anthropic's `ttl: "1h"`).

A spec's own `input_cost_per_token`/`output_cost_per_token` win and are flat: no tiers, no cache
rates (cached tokens are charged as plain input).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vero.spec.models import InferenceModel

__all__ = [
    "STANDARD_TIER",
    "CacheTokens",
    "ModelPrice",
    "PriceUnknown",
    "Rates",
    "cost_map",
    "price_of",
    "to_micro_usd",
]

_COST_MAP_FILE = "model_prices_and_context_window_backup.json"
_DEFAULT_MAX_OUTPUT_TOKENS = 4096
STANDARD_TIER = "standard"
"""The tier of a call that names none (or `auto`/`default` for OpenAI, `standard_only` for Anthropic)."""

_KEYS = {
    "input": "input_cost_per_token",
    "output": "output_cost_per_token",
    "cache_read": "cache_read_input_token_cost",
    "cache_write": "cache_creation_input_token_cost",
    "cache_write_1h": "cache_creation_input_token_cost_above_1hr",
}
_CONTEXT = re.compile(r"^input_cost_per_token_above_(\d+)k_tokens$")
_TIER = re.compile(r"^input_cost_per_token_([a-z]+)$")
_NOT_SERVICE_TIERS = frozenset({"batches", "cache"})
"""Suffixes of `input_cost_per_token_*` that are not a `service_tier` a call can ask for (batch
API prices; `input_cost_per_token_cache_hit`)."""


class PriceUnknown(LookupError):
    """Neither the spec nor LiteLLM's cost map prices the model (it cannot be metered)."""


@dataclass(frozen=True)
class Rates:
    """US dollars per token of each kind, for one service tier and context size."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    cache_write_1h: float

    def most_per_input_token(self, *, cache_write_1h: bool) -> float:
        """The highest price one input token may be billed at (a bound needs no tokenizer's view of
        which tokens get cached); the one-hour write rate counts only for calls that ask for it."""
        rates = [self.input, self.cache_read, self.cache_write]
        return max([*rates, self.cache_write_1h] if cache_write_1h else rates)


@dataclass(frozen=True)
class CacheTokens:
    """A call's prompt-cache tokens: read, written for five minutes, written for one hour."""

    read: int = 0
    write: int = 0
    write_1h: int = 0


@dataclass(frozen=True)
class ModelPrice:
    """A model's rates per service tier and context size, and its output limit per call."""

    max_output_tokens: int
    """The most output tokens one call may ask for; a call that names no limit is sent with it."""
    tiers: Mapping[str, tuple[tuple[int, Rates], ...]] = field(default_factory=dict)
    """Service tier -> ((prompt tokens over which the rates apply, rates), ...) ascending from 0."""

    @property
    def input_usd_per_token(self) -> float:
        return self.tiers[STANDARD_TIER][0][1].input

    @property
    def output_usd_per_token(self) -> float:
        return self.tiers[STANDARD_TIER][0][1].output

    def rates(self, service_tier: str = STANDARD_TIER, prompt_tokens: int = 0) -> Rates:
        """The rates of a call in `service_tier` with a prompt of `prompt_tokens` tokens.

        Raises:
            KeyError: the tier is not priced (`tiers`).
        """
        chosen = self.tiers[service_tier][0][1]
        for threshold, rates in self.tiers[service_tier]:
            if prompt_tokens > threshold:
                chosen = rates
        return chosen

    def cost_usd(
        self, input_tokens: int, output_tokens: int, cache: CacheTokens | None = None, service_tier: str = STANDARD_TIER
    ) -> float:
        """Cost of one call in US dollars. `input_tokens` excludes the cached and cache-write tokens.

        Raises:
            KeyError: the tier is not priced.
        """
        cache = cache or CacheTokens()
        prompt = input_tokens + cache.read + cache.write + cache.write_1h
        rates = self.rates(service_tier, prompt)
        return (
            input_tokens * rates.input
            + output_tokens * rates.output
            + cache.read * rates.cache_read
            + cache.write * rates.cache_write
            + cache.write_1h * rates.cache_write_1h
        )

    def bound_usd(
        self, input_tokens: int, output_tokens: int, *, service_tier: str = STANDARD_TIER, cache_write_1h: bool = False
    ) -> float:
        """The most a call of at most `input_tokens` in and `output_tokens` out can cost: every input
        token at the dearest input rate, rates of the context tier `input_tokens` reaches (rates only
        grow with the prompt)."""
        rates = self.rates(service_tier, input_tokens)
        return input_tokens * rates.most_per_input_token(cache_write_1h=cache_write_1h) + output_tokens * rates.output


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


def _entry(name: str, model: InferenceModel) -> dict[str, Any]:
    table = cost_map()
    for key in dict.fromkeys(filter(None, (model.upstream_model, name))):
        for candidate in (key, key.split("/", 1)[-1]):
            if isinstance(table.get(candidate), dict):
                return table[candidate]
    return {}


def _rates(entry: Mapping[str, Any], suffix: str, fallback: Rates | None = None) -> Rates | None:
    """The rates whose keys end in `suffix` (`""`, `_priority`, `_above_272k_tokens`, ...); a cache
    rate missing is charged as the input rate (or `fallback`'s, when that is dearer); None when the
    input or output rate is missing."""
    value = {kind: _finite(entry.get(key + suffix)) for kind, key in _KEYS.items()}
    if value["input"] is None or value["output"] is None:
        return None
    base_in = value["input"]

    def rate(kind: str) -> float:
        own = value[kind]
        if own is not None:
            return own
        return max(base_in, getattr(fallback, kind)) if fallback is not None else base_in

    write = rate("cache_write")
    return Rates(
        input=base_in,
        output=value["output"],
        cache_read=rate("cache_read"),
        cache_write=write,
        cache_write_1h=max(write, rate("cache_write_1h")),
    )


def _scaled(rates: Rates, by: Rates, over: Rates) -> Rates:
    """`rates` scaled per kind by `over / by` (a context tier's ratio applied to another service tier)."""
    values = {}
    for kind in ("input", "output", "cache_read", "cache_write", "cache_write_1h"):
        base, up = getattr(by, kind), getattr(over, kind)
        values[kind] = getattr(rates, kind) * (up / base if base > 0 else 1.0)
        values[kind] = max(values[kind], getattr(rates, kind), up)
    return Rates(**values)


def _tiers(entry: Mapping[str, Any]) -> dict[str, tuple[tuple[int, Rates], ...]]:
    """Every service tier the map prices, each with its context-size tiers (module docstring)."""
    standard = _rates(entry, "")
    if standard is None:
        return {}
    contexts = sorted({int(m.group(1)) for key in entry if (m := _CONTEXT.match(key))})
    names = {m.group(1) for key in entry if (m := _TIER.match(key))} - _NOT_SERVICE_TIERS
    standard_steps = [(0, standard)]
    for k in contexts:
        rates = _rates(entry, f"_above_{k}k_tokens", standard_steps[-1][1])
        if rates is not None:
            standard_steps.append((k * 1000, rates))
    tiers = {STANDARD_TIER: tuple(standard_steps)}
    for name in sorted(names):
        base = _rates(entry, f"_{name}", standard)
        if base is None:
            continue
        steps = [(0, base)]
        for threshold, context_rates in standard_steps[1:]:
            own = _rates(entry, f"_above_{threshold // 1000}k_tokens_{name}", steps[-1][1])
            steps.append((threshold, own if own is not None else _scaled(base, standard, context_rates)))
        tiers[name] = tuple(steps)
    return tiers


def price_of(name: str, model: InferenceModel) -> ModelPrice:
    """The price of allow-listed model `name` (module docstring).

    Raises:
        PriceUnknown: a price is neither in the spec nor in the cost map (under the upstream id or
            the allow-list name, with or without a `provider/` prefix).
    """
    entry = _entry(name, model)
    max_output = model.max_output_tokens or entry.get("max_output_tokens")
    if not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 1:
        max_output = _DEFAULT_MAX_OUTPUT_TOKENS
    if model.input_cost_per_token is not None or model.output_cost_per_token is not None:
        input_price = model.input_cost_per_token
        output_price = model.output_cost_per_token
        if input_price is None:
            input_price = _finite(entry.get("input_cost_per_token"))
        if output_price is None:
            output_price = _finite(entry.get("output_cost_per_token"))
        if input_price is None or output_price is None:
            raise PriceUnknown(f"no price for model {name!r}: give input_cost_per_token and output_cost_per_token")
        flat = Rates(input_price, output_price, input_price, input_price, input_price)
        return ModelPrice(max_output_tokens=max_output, tiers={STANDARD_TIER: ((0, flat),)})
    tiers = _tiers(entry)
    if not tiers:
        raise PriceUnknown(f"no price for model {name!r}: give input_cost_per_token and output_cost_per_token")
    return ModelPrice(max_output_tokens=max_output, tiers=tiers)


def to_micro_usd(usd: float) -> int:
    """US dollars -> whole micro-dollars, rounded up (metering never under-charges)."""
    return math.ceil(usd * 1_000_000 - 1e-9) if usd > 0 else 0
