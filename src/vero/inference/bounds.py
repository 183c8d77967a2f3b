"""The most one model call can cost, from its request alone, before it is forwarded (docs/inference.md).

A call is forwarded only with a hold of its bound, so what the provider bills never exceeds the
budgets (`vero.inference.gateway`). The bound is:

- **input**: the bytes of the body as forwarded (a token is at least one byte of the text it
  stands for; the body is re-encoded as ASCII JSON, so no character is fewer bytes than sent),
  plus `CALL_OVERHEAD_TOKENS` (the prompt a provider adds around messages and tools), plus
  `IMAGE_TOKENS` per inline image (an image's tokens follow its pixels, not its bytes: OpenAI's
  largest per-image count, gpt-4o-mini's 2833 + 5667 per tile at eight tiles, is under it);
- **output**: the request's output limit (`max_completion_tokens`/`max_tokens` for chat
  completions, `max_output_tokens` for responses, `max_tokens` for Anthropic), times `n` for chat
  completions; a request without one is sent with the model's `max_output_tokens`, and one over
  it is refused (400 naming the field);
- at the rates of the request's `service_tier` (one the price does not list is refused) and of the
  context tier the input bound reaches, every input token at the dearest input rate (cache writes
  included; the one-hour rate when the request asks `ttl: "1h"`).

A request whose cost its body cannot bound is refused (400 naming the field): input the provider
holds (`previous_response_id`, `conversation`, a stored `prompt`, `item_reference`, file ids,
Anthropic `container`), remote input (image, file and document URLs), inline files, documents and
audio (pages and seconds are not bytes), tools the provider runs (web search, file search, code
interpreter, remote MCP, Anthropic server tools), `background`, audio output and `prediction`.
A model entry with `unbounded_call_usd` accepts them, holding that much per call on top of the
bound: the operator's own statement of what such a call can cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from vero.inference.pricing import STANDARD_TIER, ModelPrice, to_micro_usd

__all__ = ["CALL_OVERHEAD_TOKENS", "IMAGE_TOKENS", "CallBound", "Unbounded", "bound_call"]

Api = Literal["openai", "anthropic"]

CALL_OVERHEAD_TOKENS = 2048
"""Input tokens a provider may add to a call beyond its body (chat templates, the tool-use system
prompt: Anthropic's is 346 tokens, its computer/bash/editor tools under 800 each)."""
IMAGE_TOKENS = 50_000
"""Input tokens bounding one inline image (module docstring)."""

_OUTPUT_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("openai", "/chat/completions"): ("max_completion_tokens", "max_tokens"),
    ("openai", "/responses"): ("max_output_tokens",),
    ("anthropic", "/messages"): ("max_tokens",),
}
_PROVIDER_HELD_FIELDS = ("previous_response_id", "conversation", "prompt", "container", "mcp_servers", "background")
_REFUSED_FIELDS = ("web_search_options", "prediction", "audio")
_SCHEMA_FIELDS = frozenset({"tools", "tool_choice", "response_format", "text", "metadata", "output_config"})
_CLIENT_TOOL_TYPES = ("function", "custom", "local_shell", "shell", "apply_patch")
_CLIENT_TOOL_PREFIXES = ("computer_", "bash_", "text_editor_", "memory_")
_OPENAI_TIERS = {None: STANDARD_TIER, "auto": STANDARD_TIER, "default": STANDARD_TIER}
_ANTHROPIC_TIERS = {None: STANDARD_TIER, "auto": STANDARD_TIER, "standard_only": STANDARD_TIER}


class Unbounded(ValueError):
    """A request the gateway refuses with 400: `field` (a path into the body) is why."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


@dataclass(frozen=True)
class CallBound:
    """One call's bound: token counts, the tier it is priced at, and the hold in micro-dollars."""

    input_tokens: int
    output_tokens: int
    service_tier: str
    cache_write_1h: bool
    micro_usd: int
    body: bytes
    """The request to forward (the bound counts its bytes)."""
    stream: bool = False
    """The request asks for a stream (`"stream": true`)."""
    unbounded_field: str | None = None
    """The field accepted under the model's `unbounded_call_usd` (None: bounded by its body)."""


def _int_field(payload: dict[str, Any], key: str) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Unbounded(key, "expected a positive integer")
    return value


def _output_tokens(payload: dict[str, Any], api: Api, path: str, price: ModelPrice) -> int:
    """The output bound; sets the limit in `payload` when the request has none."""
    fields = _OUTPUT_FIELDS.get((api, path), ("max_tokens",))
    given = {key: value for key in fields if (value := _int_field(payload, key)) is not None}
    for key, value in given.items():
        if value > price.max_output_tokens:
            raise Unbounded(key, f"{value} is over this model's limit of {price.max_output_tokens} output tokens")
    if not given:
        payload[fields[0]] = price.max_output_tokens
    limit = max(given.values(), default=price.max_output_tokens)
    choices = _int_field(payload, "n") if (api, path) == ("openai", "/chat/completions") else None
    if payload.get("n") is not None and choices is None:
        raise Unbounded("n", "only chat completions take `n`")
    return limit * (choices or 1)


def _walk(value: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in a JSON value with its path (`messages[0].content[1]`)."""
    if isinstance(value, dict):
        yield where, value
        for key, item in value.items():
            yield from _walk(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{where}[{i}]")


def _remote(url: Any) -> bool:
    return isinstance(url, str) and not url.startswith("data:")


def _part_problem(part: dict[str, Any]) -> str | None:
    """Why one content part cannot be bounded from the body (None: it can)."""
    kind = part.get("type")
    raw_source = part.get("source")
    source: dict[str, Any] = raw_source if isinstance(raw_source, dict) else {}
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    problems = [
        ("file_id" in part and kind is not None, "a file the provider holds"),
        (kind == "item_reference", "an item the provider holds"),
        (kind in ("image_url", "input_image") and (_remote(url) or "file_id" in part), "a remote image"),
        (kind in ("file", "input_file", "input_audio", "container_upload"), "a file or audio (not bounded by bytes)"),
        (kind == "image" and source.get("type") != "base64", "a remote image"),
        (kind == "document" and source.get("type") not in ("text", "content"), "a document (pages are not bytes)"),
    ]
    return next((why for problem, why in problems if problem), None)


def _tool_problem(tool: Any, api: Api) -> str | None:
    if not isinstance(tool, dict):
        return None
    kind = tool.get("type")
    if kind is None or kind in _CLIENT_TOOL_TYPES:
        return None
    if api == "anthropic" and isinstance(kind, str) and kind.startswith(_CLIENT_TOOL_PREFIXES):
        return None
    return f"a tool the provider runs ({kind!r})"


def _unbounded_field(payload: dict[str, Any], api: Api) -> tuple[str, str] | None:
    """The first field whose cost the body cannot bound, and why (module docstring)."""
    for key in _PROVIDER_HELD_FIELDS:
        if payload.get(key) not in (None, False):
            return key, "input or work the provider holds"
    for key in _REFUSED_FIELDS:
        if payload.get(key) is not None:
            return key, "priced apart from the call's tokens"
    if "audio" in (payload.get("modalities") or []):
        return "modalities", "audio output is priced apart from the call's tokens"
    tools = payload.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if (why := _tool_problem(tool, api)) is not None:
            return f"tools[{i}].type", why
    for where, part in _walk(_content(payload), ""):
        if (why := _part_problem(part)) is not None:
            return where, why
    return None


def _content(payload: dict[str, Any]) -> dict[str, Any]:
    """The request without its schemas (tools, output formats): what is sent to the model as input
    parts. A JSON schema's `type` keys are not content parts."""
    return {k: v for k, v in payload.items() if k not in _SCHEMA_FIELDS}


def _images(payload: dict[str, Any]) -> int:
    return sum(
        1 for _, part in _walk(_content(payload), "") if part.get("type") in ("image", "image_url", "input_image")
    )


def _service_tier(payload: dict[str, Any], api: Api, price: ModelPrice) -> str:
    requested = payload.get("service_tier")
    known = _ANTHROPIC_TIERS if api == "anthropic" else _OPENAI_TIERS
    if isinstance(requested, str) or requested is None:
        if requested in known:
            return known[requested]
        if api == "openai" and requested in price.tiers:
            return str(requested)
    raise Unbounded("service_tier", f"{requested!r} is not priced for this model (priced: {sorted(price.tiers)})")


def _asks_one_hour_cache(payload: dict[str, Any]) -> bool:
    return any(
        isinstance(part.get("cache_control"), dict) and part["cache_control"].get("ttl") == "1h"
        for _, part in _walk(payload, "")
    )


def bound_call(
    payload: dict[str, Any],
    api: Api,
    path: str,
    price: ModelPrice,
    unbounded_call_usd: float | None = None,
) -> CallBound:
    """The bound of one call and the body to forward (module docstring).

    Args:
        payload: the request's JSON body as it is to be forwarded (changed in place: the output
            limit is set when it has none).
        api, path: the endpoint's wire format and path (`/chat/completions`, `/responses`, `/messages`).
        price: the model's price.
        unbounded_call_usd: the model entry's allowance for requests the body cannot bound.

    Raises:
        Unbounded: the request cannot be bounded or asks for more than the model allows.
    """
    if payload.get("speed") not in (None, "standard"):
        raise Unbounded("speed", "priced apart from the standard rates")
    unbounded = _unbounded_field(payload, api)
    if unbounded is not None and unbounded_call_usd is None:
        raise Unbounded(*unbounded)
    tier = _service_tier(payload, api, price)
    output = _output_tokens(payload, api, path, price)
    one_hour = _asks_one_hour_cache(payload)
    body = json.dumps(payload).encode()
    input_tokens = len(body) + CALL_OVERHEAD_TOKENS + IMAGE_TOKENS * _images(payload)
    usd = price.bound_usd(input_tokens, output, service_tier=tier, cache_write_1h=one_hour)
    if unbounded is not None:
        usd += unbounded_call_usd or 0.0
    return CallBound(
        input_tokens=input_tokens,
        output_tokens=output,
        service_tier=tier,
        cache_write_1h=one_hour,
        micro_usd=max(1, to_micro_usd(usd)),
        body=body,
        stream=payload.get("stream") is True,
        unbounded_field=unbounded[0] if unbounded is not None else None,
    )
