"""What a client joins from a stream, to check that a provider key split across events never
reaches it (`fake_upstream`'s `fake-leak`)."""

from __future__ import annotations

import json


def joined_text(stream: str) -> str:
    """The text a client joins from a stream's deltas (OpenAI chat and responses, Anthropic messages)."""
    text = ""
    for line in stream.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            delta = choice["delta"]
            text += delta.get("content") or "".join(t["function"]["arguments"] for t in delta.get("tool_calls", []))
        if event.get("type") == "response.output_text.delta":
            text += event["delta"]
        if event.get("type") == "content_block_delta":
            text += event["delta"].get("text") or event["delta"].get("partial_json", "")
    return text


def leak_request(route: str, model: str, message: str, *, stream: bool = True) -> dict:
    if route.endswith("/responses"):
        return {"model": model, "input": message, "stream": stream, "max_output_tokens": 10}
    return {"model": model, "max_tokens": 10, "stream": stream, "messages": [{"role": "user", "content": message}]}


def key_pieces(key: str, size: int = 6) -> set[str]:
    return {key[i : i + size] for i in range(len(key) - size + 1)}


def assert_no_key_in_stream(stream: str, key: str, words: str) -> None:
    """The client joins `before *** after` from the deltas, whatever their split, and no event
    holds six characters of the key in a row."""
    assert joined_text(stream) == "before *** after", (words, stream)
    assert not any(piece in stream for piece in key_pieces(key)), (words, stream)
