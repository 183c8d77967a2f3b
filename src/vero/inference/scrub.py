"""Provider keys out of what the gateway passes back (docs/inference.md, "Holds are upper bounds").

The gateway holds the provider keys; an answer could still carry one (an error body echoing the
request's headers, a proxy reflecting them, a provider streaming its own key). `SecretScrub`
takes them out:

- of a whole body (`SecretScrub.body`): every occurrence in the raw bytes and, when the body is
  JSON, in every decoded string and object key (a key written with JSON escapes, `\\u0073k-...`,
  is the same key to the client);
- of a stream (`SecretScrub.stream`, one `StreamScrub` per stream): each line as a whole body,
  and across events. A client joins a text from its deltas, so a key split over several events
  would pass a scrub of each event alone. The stream scrub follows *channels* of text: each
  delta field (`TEXT_FIELDS`) of each part of the answer (the identity fields of the objects
  holding it, `IDENTITY_FIELDS`: a chat choice and its tool calls, an Anthropic content block, a
  Responses output item's content part), and all of the stream's delta text in order. A line is
  held back while the text it carries could still be the start of a key (the end of a channel's
  text is a proper prefix of a key); the next text of that channel decides it. A key found is
  replaced by `***` where it starts and removed from the other events that carried it, and the
  lines are then sent in their order (a line without a key keeps its bytes).
  A part's channels end with the part (Anthropic `*_stop`, a Responses `*.done` event, a chat
  choice's `finish_reason`), every channel with the stream (`StreamScrub.finish`); an undecided
  end of `PARTIAL_KEY_CHARS` or more is then removed as well: a stream cut off inside a key
  passes none of it.

Not covered: text a client joins across parts (two content blocks shown one after the other) is
followed only in the stream's order, so a key split between two parts with another part's
delta between them passes (providers stream one part after the other).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IDENTITY_FIELDS", "PARTIAL_KEY_CHARS", "REDACTED", "TEXT_FIELDS", "SecretScrub", "StreamScrub"]

REDACTED = "***"
"""What a key is replaced with."""
PARTIAL_KEY_CHARS = 4
"""An undecided start of a key this long or longer at the end of a channel is removed (shorter
ones, like `sk-`, say nothing of a key)."""
TEXT_FIELDS = frozenset(
    {"text", "content", "partial_json", "thinking", "arguments", "delta", "refusal", "reasoning_content", "reasoning"}
)
"""Fields whose string values a client joins across events (OpenAI chat and Responses deltas,
Anthropic text, thinking and tool-input deltas)."""
IDENTITY_FIELDS = ("index", "output_index", "item_id", "content_index", "summary_index")
"""Fields naming the part of an answer an object belongs to, in the order they key a channel."""

_Identity = tuple[tuple[str, Any], ...]


@dataclass(eq=False)
class _Fragment:
    """One delta string of a held line: where it lives in the line's JSON, what is cut of it."""

    holder: dict[str, Any]
    name: str
    text: str
    cut: set[int] = field(default_factory=set)
    """Offsets of characters removed (parts of a key)."""
    starts: set[int] = field(default_factory=set)
    """Of `cut`, offsets where a key starts (`REDACTED` goes there)."""
    pending: int = 0
    """Channels whose undecided end still holds part of this text."""

    def rendered(self) -> str:
        if not self.cut:
            return self.text
        out: list[str] = []
        for offset, char in enumerate(self.text):
            if offset in self.starts:
                out.append(REDACTED)
            if offset not in self.cut:
                out.append(char)
        return "".join(out)


@dataclass(eq=False)
class _Line:
    raw: bytes
    payload: Any = None
    changed: bool = False
    fragments: list[_Fragment] = field(default_factory=list)


@dataclass(eq=False)
class _Channel:
    """The undecided end of one channel's text and the fragments it came from, in order."""

    text: str = ""
    pieces: list[tuple[_Fragment, int]] = field(default_factory=list)
    """(fragment, offset in it where its share of `text` starts)."""

    def add(self, fragment: _Fragment, secrets: tuple[str, ...]) -> None:
        self.text += fragment.text
        self.pieces.append((fragment, 0))
        fragment.pending += 1
        for secret in secrets:
            start = self.text.find(secret)
            while start >= 0:
                self._cut(start, len(secret))
                start = self.text.find(secret, start + 1)
        self._settle(_undecided_start(self.text, secrets))

    def close(self) -> None:
        if len(self.text) >= PARTIAL_KEY_CHARS:
            self._cut(0, len(self.text))
        self._settle(len(self.text))

    def _cut(self, start: int, length: int) -> None:
        position = 0
        for fragment, offset in self.pieces:
            span = len(fragment.text) - offset
            low, high = max(start, position), min(start + length, position + span)
            if low < high:
                fragment.cut.update(range(offset + low - position, offset + high - position))
                if low == start:
                    fragment.starts.add(offset + low - position)
            position += span

    def _settle(self, keep_from: int) -> None:
        """Forget the text before `keep_from`: no key can include it any more."""
        position, kept = 0, []
        for fragment, offset in self.pieces:
            span = len(fragment.text) - offset
            if position + span <= keep_from:
                fragment.pending -= 1
            else:
                kept.append((fragment, offset + max(0, keep_from - position)))
            position += span
        self.pieces = kept
        self.text = self.text[keep_from:]


def _undecided_start(text: str, secrets: tuple[str, ...]) -> int:
    """Where the longest end of `text` that is a proper prefix of a secret starts (len: none)."""
    best = len(text)
    for secret in secrets:
        # Only where the secret's first character is can its prefix start (found in C, not tried
        # at every offset).
        start = text.find(secret[0], max(0, len(text) - len(secret) + 1))
        while 0 <= start < best:
            if secret.startswith(text[start:]):
                best = start
                break
            start = text.find(secret[0], start + 1)
    return best


def _identity(value: dict[str, Any]) -> _Identity:
    return tuple((name, value[name]) for name in IDENTITY_FIELDS if isinstance(value.get(name), (int, str)))


def _deltas(value: Any, identity: _Identity = ()) -> Iterator[tuple[_Identity, dict[str, Any], str]]:
    """(part identity, holding object, field) of every string of a `TEXT_FIELDS` field in `value`."""
    if isinstance(value, list):
        for item in value:
            yield from _deltas(item, identity)
    elif isinstance(value, dict):
        mine = identity + _identity(value)
        for name, item in value.items():
            if isinstance(item, str):
                if name in TEXT_FIELDS and item:
                    yield mine, value, name
            else:
                yield from _deltas(item, mine)


def _ended_parts(event: Any) -> list[_Identity]:
    """Identities of the parts `event` ends (see the module docstring)."""
    if not isinstance(event, dict):
        return []
    ended = []
    kind = event.get("type")
    if isinstance(kind, str) and kind.endswith(("_stop", ".done")):
        ended.append(_identity(event))
    choices = event.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            ended.append(_identity(event) + _identity(choice))
    return ended


class SecretScrub:
    """The keys to take out (values of at least 4 characters; shorter ones are ignored).

    Args:
        secrets: the key values.
    """

    def __init__(self, secrets: list[str] | set[str] | tuple[str, ...]) -> None:
        self.secrets = tuple(sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True))
        self._encoded = tuple(s.encode() for s in self.secrets)
        self._plain = all(c.isascii() and (c.isalnum() or c in "-_.~+=:") for s in self.secrets for c in s)
        """No key has a character JSON may escape: a key in a decoded string of a line without
        `\\u` escapes is in its raw bytes too (`may_hide`)."""

    def may_hide(self, raw: bytes) -> bool:
        """Whether a key could be in `raw`'s decoded JSON strings though not in its bytes."""
        return not self._plain or b"\\u" in raw or any(secret in raw for secret in self._encoded)

    def raw(self, data: bytes) -> bytes:
        """`data` with every key's bytes replaced by `***`."""
        for secret in self._encoded:
            if secret in data:
                data = data.replace(secret, REDACTED.encode())
        return data

    def value(self, value: Any) -> tuple[Any, bool]:
        """A decoded JSON value with every key taken out of its strings and object keys: (the
        value, whether anything changed); containers are changed in place."""
        if isinstance(value, str):
            scrubbed = value
            for secret in self.secrets:
                scrubbed = scrubbed.replace(secret, REDACTED)
            return scrubbed, scrubbed != value
        changed = False
        if isinstance(value, list):
            for i, item in enumerate(value):
                value[i], was = self.value(item)
                changed = changed or was
        elif isinstance(value, dict):
            for name in list(value):
                item, was = self.value(value[name])
                new_name, renamed = self.value(name)
                if renamed:
                    del value[name]
                value[new_name] = item
                changed = changed or was or renamed
        return value, changed

    def body(self, data: bytes) -> bytes:
        """A whole answer body without keys (raw bytes, and decoded strings when it is JSON)."""
        if self.secrets and data[:1] in (b"{", b"["):
            try:
                payload = json.loads(data)
            except ValueError:
                payload = None
            if payload is not None:
                payload, changed = self.value(payload)
                if changed:
                    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        return self.raw(data)

    def stream(self) -> StreamScrub:
        """The scrub of one stream (see the module docstring)."""
        return StreamScrub(self)


class StreamScrub:
    """The scrub of one server-sent-events stream, fed whole lines in order (module docstring).

    `add` each line (with its line ending) and what its `data:` decodes to (None: not JSON),
    then send what `ready` returns; `finish` at the end of the stream returns the rest.
    """

    def __init__(self, scrub: SecretScrub) -> None:
        self._scrub = scrub
        self._queue: deque[_Line] = deque()
        self._parts: dict[tuple[_Identity, str], _Channel] = {}
        self._all = _Channel()

    def add(self, raw: bytes, event: Any) -> None:
        """Take one line; `event` is its decoded `data:` (changed in place when a key is cut)."""
        line = _Line(raw)
        self._queue.append(line)
        secrets = self._scrub.secrets
        if not secrets or event is None or not isinstance(event, (dict, list)):
            return
        if self._scrub.may_hide(raw):
            line.payload, line.changed = self._scrub.value(event)
        else:
            line.payload = event
        for identity, holder, name in _deltas(line.payload):
            fragment = _Fragment(holder, name, holder[name])
            line.fragments.append(fragment)
            self._parts.setdefault((identity, name), _Channel()).add(fragment, secrets)
            self._all.add(fragment, secrets)
        for ended in _ended_parts(line.payload):
            for key in [k for k in self._parts if k[0][: len(ended)] == ended]:
                self._parts.pop(key).close()

    def ready(self) -> bytes:
        """The lines that can be sent now, in order (scrubbed)."""
        out: list[bytes] = []
        while self._queue and all(f.pending == 0 for f in self._queue[0].fragments):
            out.append(self._render(self._queue.popleft()))
        return b"".join(out)

    def finish(self) -> bytes:
        """The stream ended (or broke off): every channel ends, every line held is returned."""
        for channel in (*self._parts.values(), self._all):
            channel.close()
        self._parts.clear()
        return self.ready()

    def _render(self, line: _Line) -> bytes:
        cut = False
        for fragment in line.fragments:
            if fragment.cut:
                fragment.holder[fragment.name] = fragment.rendered()
                cut = True
        if not (cut or line.changed):
            return self._scrub.raw(line.raw)
        body = line.raw.rstrip(b"\r\n")
        ending = line.raw[len(body) :]
        prefix = b"data: " if body.startswith(b"data: ") else b"data:"
        data = json.dumps(line.payload, ensure_ascii=False, separators=(",", ":")).encode()
        return self._scrub.raw(prefix + data + ending)
