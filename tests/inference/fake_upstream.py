"""A fake OpenAI- and Anthropic-compatible provider on loopback, for gateway tests and the benchmark.

Real HTTP (uvicorn in a thread). Behaviour per request is chosen by the model name:
`fake-ok` answers with usage; `fake-500` answers 500; `fake-slow` sleeps past any test timeout;
`fake-401` answers 401 with a body that echoes the key it was sent (as real providers do in part);
`fake-delay` answers like `fake-ok` after a second;
`fake-nousage` answers without usage; `fake-stall` streams its first events, then stalls (never
finishes); `fake-trickle` streams its first event, then a comment line every 0.2 s (never finishes,
never stalls); `fake-greedy` bills what it is asked, the most a provider could (input: the body's
bytes, plus `HELD_INPUT_TOKENS` when it names input the provider holds; output: the request's limit
times `n`, `UNLIMITED_OUTPUT_TOKENS` without a limit), recorded as `billed` with the request, and
streams deltas without end when asked to stream (`fake-endless` too); `fake-leak` answers with
the key it was sent, streamed split where the last message says (`leak_split_text`); any other
model answers
`responder(body)` (default "hi"), the stand-in for a model's reply. Streaming (`"stream": true`)
sends SSE in each wire format.
Every request's path, headers and body are recorded in `requests`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

INPUT_TOKENS = 11
OUTPUT_TOKENS = 7
HELD_INPUT_TOKENS = 1_000_000
UNLIMITED_OUTPUT_TOKENS = 1_000_000_000
_HELD = ("previous_response_id", "conversation", "file_id", "container", "mcp_servers", "web_search")


def greedy_bill(raw: bytes, body: dict[str, Any]) -> tuple[int, int]:
    """(input, output) tokens `fake-greedy` bills for a request (module docstring)."""
    held = any(f'"{name}"'.encode() in raw for name in _HELD) or b'"url"' in raw or b"http" in raw
    limit = next(
        (body[k] for k in ("max_completion_tokens", "max_tokens", "max_output_tokens") if isinstance(body.get(k), int)),
        UNLIMITED_OUTPUT_TOKENS,
    )
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    return len(raw) + (HELD_INPUT_TOKENS if held else 0), limit * n


async def _endless(model: str, kind: str):
    event = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x"}}]}
    if kind == "messages":
        event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}
    while True:  # ended by the caller going away or the server stopping
        yield _sse([(None, event)])
        await asyncio.sleep(0.01)


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = b""
    for name, data in events:
        if name:
            out += f"event: {name}\n".encode()
        out += b"data: " + json.dumps(data).encode() + b"\n\n"
    return out


def leak_split_text(message: str, key: str) -> list[str]:
    """The text deltas `fake-leak` streams for a last message `cut I,J,...` (character offsets
    into the key; `tool` in it: as tool input instead of text): `before <key> after`, the key
    split at those offsets (no cut: one piece per character)."""
    cuts = sorted({int(c) for c in message.split()[1].split(",")}) if message.startswith("cut ") else []
    bounds = [0, *cuts, len(key)] if cuts else list(range(len(key) + 1))
    pieces = [key[a:b] for a, b in itertools.pairwise(bounds)]
    return ["before ", *pieces, " after"]


def _escaped(data: dict[str, Any], key: str) -> bytes:
    """`data` as JSON with the key's characters written as \\u escapes wherever they appear."""
    raw = json.dumps(data)
    for piece in sorted({key[i:j] for i in range(len(key)) for j in range(i + 1, len(key) + 1)}, key=len)[::-1]:
        if len(piece) >= 4:
            raw = raw.replace(piece, "".join(f"\\u{ord(c):04x}" for c in piece))
    return raw.encode()


def _leak(kind: str, model: str, key: str, message: str) -> bytes:
    """`fake-leak`'s stream (SSE in `kind`'s wire format, with usage)."""
    deltas = leak_split_text(message, key)
    tool = "tool" in message.split()
    events: list[tuple[str | None, dict[str, Any]]] = []
    if kind == "chat":
        for part in deltas:
            delta: dict[str, Any] = {"content": part}
            if tool:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": part}}]}
            events.append(
                (None, {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})
            )
        events.append((None, {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        usage = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS}
        events.append((None, {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        return _sse(events) + b"data: [DONE]\n\n"
    if kind == "responses":
        part = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        events.append(("response.created", {"type": "response.created", "response": {"id": "r1"}}))
        for piece in deltas:
            events.append(
                ("response.output_text.delta", {"type": "response.output_text.delta", **part, "delta": piece})
            )
        events.append(
            ("response.output_text.done", {"type": "response.output_text.done", **part, "text": "".join(deltas)})
        )
        usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}
        response = {"id": "r1", "object": "response", "status": "completed", "usage": usage}
        events.append(("response.completed", {"type": "response.completed", "response": response}))
        return _sse(events)
    block = {"type": "tool_use", "id": "t1", "name": "f", "input": {}} if tool else {"type": "text", "text": ""}
    start = {"id": "m1", "type": "message", "role": "assistant", "model": model, "content": []}
    start["usage"] = {"input_tokens": INPUT_TOKENS, "output_tokens": 1}
    events.append(("message_start", {"type": "message_start", "message": start}))
    events.append(("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}))
    for piece in deltas:
        delta = {"type": "input_json_delta", "partial_json": piece} if tool else {"type": "text_delta", "text": piece}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    usage = {"output_tokens": OUTPUT_TOKENS}
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return _sse(events)


def create_fake_app(requests: list[dict[str, Any]], responder: Callable[[dict], str] | None = None) -> FastAPI:
    app = FastAPI()

    async def common(request: Request, kind: str):
        raw = await request.body()
        body = json.loads(raw)
        record: dict[str, Any] = {"path": request.url.path, "headers": dict(request.headers), "body": body}
        requests.append(record)
        model = body.get("model", "")
        if model.endswith(("fake-greedy", "fake-endless")):
            input_tokens, output_tokens = greedy_bill(raw, body)
            record["billed"] = {"input": input_tokens, "output": output_tokens}
            if body.get("stream") is True or model.endswith("fake-endless"):
                return StreamingResponse(_endless(model, kind), media_type="text/event-stream")
            usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "input_tokens": input_tokens}
            usage["output_tokens"] = output_tokens
            return JSONResponse(
                {"id": "g1", "object": "chat.completion", "model": model, "choices": [], "usage": usage}
            )
        key = request.headers.get("x-api-key") or request.headers.get("authorization", "")
        if model.endswith("fake-leak"):
            sent = key.removeprefix("Bearer ")
            message = str(body["messages"][-1]["content"]) if body.get("messages") else str(body.get("input"))
            if body.get("stream") is True:
                return StreamingResponse(iter([_leak(kind, model, sent, message)]), media_type="text/event-stream")
            text = "".join(leak_split_text(message, sent))
            answer = {
                "id": "c1",
                "object": "chat.completion",
                "model": model,
                "content": [{"type": "text", "text": text}],
            }
            answer["choices"] = [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
            answer["usage"] = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS, "input_tokens": 1}
            return Response(_escaped(answer, sent), media_type="application/json")
        if model.endswith("fake-500"):
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if model.endswith("fake-401"):
            return JSONResponse({"error": {"message": f"Incorrect API key provided: {key}"}}, status_code=401)
        if model.endswith("fake-400"):
            return JSONResponse({"error": {"message": "bad parameter"}}, status_code=400)
        if model.endswith("fake-slow"):
            await asyncio.sleep(30)
        if model.endswith("fake-delay"):
            await asyncio.sleep(1)
        usage_ok = not model.endswith("fake-nousage")
        text = responder(body) if responder is not None else "hi"
        stream = body.get("stream") is True
        if kind == "chat":
            usage = {
                "prompt_tokens": INPUT_TOKENS,
                "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            }
            if not stream:
                return JSONResponse(
                    {
                        "id": "c1",
                        "object": "chat.completion",
                        "model": model,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                        **({"usage": usage} if usage_ok else {}),
                    }
                )
            include = (body.get("stream_options") or {}).get("include_usage")
            events = [
                (
                    None,
                    {
                        "id": "c1",
                        "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": {"content": part}}],
                    },
                )
                for part in ("h", "i")
            ]
            if include and usage_ok:
                events.append((None, {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage}))
            data = _sse(events) + b"data: [DONE]\n\n"
        elif kind == "responses":
            usage = {
                "input_tokens": INPUT_TOKENS,
                "output_tokens": OUTPUT_TOKENS,
                "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            }
            response = {
                "id": "r1",
                "object": "response",
                "model": model,
                "status": "completed",
                "output": [
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
                ],
                **({"usage": usage} if usage_ok else {}),
            }
            if not stream:
                return JSONResponse(response)
            data = _sse(
                [
                    ("response.created", {"type": "response.created", "response": {"id": "r1"}}),
                    ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "hi"}),
                    ("response.completed", {"type": "response.completed", "response": response}),
                ]
            )
        else:
            usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}
            message = {
                "id": "m1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                **({"usage": usage} if usage_ok else {}),
            }
            if not stream:
                return JSONResponse(message)
            start = {**message, "content": [], "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1}}
            events = [
                ("message_start", {"type": "message_start", "message": start}),
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
                ),
            ]
            if usage_ok:
                events.append(
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": "end_turn"},
                            "usage": {"output_tokens": OUTPUT_TOKENS},
                        },
                    )
                )
            else:
                events[0] = ("message_start", {"type": "message_start", "message": {**message, "content": []}})
            events.append(("message_stop", {"type": "message_stop"}))
            data = _sse(events)

        stall_after = data.index(b"\n\n") + 2 if model.endswith("fake-stall") else None  # one whole event

        trickle = model.endswith("fake-trickle")

        async def chunks():
            if trickle:
                yield data[: data.index(b"\n\n") + 2]
                while True:  # ended by the caller going away or the server stopping
                    await asyncio.sleep(0.2)
                    yield b": keep-alive\n\n"
            for i in range(0, len(data), 37):  # odd-sized pieces: lines split across reads
                yield data[i : i + 37]
                if stall_after is not None and i + 37 >= stall_after:
                    await asyncio.sleep(3600)  # ended by the caller going away or the server stopping

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await common(request, "chat")

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await common(request, "responses")

    @app.post("/v1/messages")
    async def messages(request: Request):
        return await common(request, "messages")

    return app


class FakeUpstream:
    """`with FakeUpstream() as fake:` serves on `fake.url` (loopback); `fake.requests` records calls."""

    def __init__(self, responder: Callable[[dict], str] | None = None, host: str = "127.0.0.1") -> None:
        self.requests: list[dict[str, Any]] = []
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_fake_app(self.requests, responder),
            host=host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeUpstream:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake upstream did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
