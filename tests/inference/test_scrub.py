"""`vero.inference.scrub` on its own: keys written with JSON escapes, in object keys, in lines
that are not JSON, and a stream cut off inside a key (the gateway tests stream real keys through
real HTTP at every split offset)."""

from __future__ import annotations

import json

from vero.inference.scrub import SecretScrub

KEY = "sk-ant-api03-Zx9_key-value-0123456789"


def escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


def delta_line(raw_text: str) -> bytes:
    """An Anthropic text delta whose JSON string is `raw_text` as written (escapes kept)."""
    return b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"' + (
        raw_text.encode() + b'"}}\n'
    )


def run_stream(lines: list[bytes]) -> bytes:
    stream = SecretScrub([KEY]).stream()
    out = b""
    for line in lines:
        event = json.loads(line[5:]) if line.startswith(b"data: {") else None
        stream.add(line, event)
        out += stream.ready()
    return out + stream.finish()


def joined(out: bytes) -> str:
    return "".join(
        json.loads(line[5:])["delta"]["text"] for line in out.splitlines() if line.startswith(b'data: {"type":"content')
    )


def test_a_key_written_with_json_escapes_is_found_in_one_event_and_across_two():
    whole = run_stream([delta_line("a " + escaped(KEY) + " b")])
    assert joined(whole) == "a *** b" and b"\\u00" not in whole
    split = run_stream([delta_line("a " + escaped(KEY[:9])), delta_line(escaped(KEY[9:]) + " b")])
    assert joined(split) == "a *** b"


def test_keys_in_object_keys_and_in_lines_that_are_not_json_are_replaced():
    out = run_stream([f'data: {{"{KEY}": 1}}\n'.encode(), f"data: {KEY} plain\n".encode(), b": comment\n"])
    assert KEY.encode() not in out and out.count(b"***") == 2 and out.endswith(b": comment\n")


def test_a_stream_cut_off_inside_a_key_passes_none_of_its_start_and_short_ends_pass():
    assert joined(run_stream([delta_line("a " + KEY[:20])])) == "a ***"
    assert joined(run_stream([delta_line("plans")])) == "plans"  # `s` might start a key: held, then sent
    assert joined(run_stream([delta_line("a sk-")])) == "a sk-"  # under 4 characters: nothing of a key


def test_a_body_without_a_key_keeps_its_bytes_and_one_with_an_escaped_key_is_scrubbed():
    scrub = SecretScrub([KEY])
    plain = b'{"a": "nothing here",  "b": [1, 2]}'
    assert scrub.body(plain) == plain
    hidden = ('{"text": "x ' + escaped(KEY) + '"}').encode()
    assert json.loads(scrub.body(hidden)) == {"text": "x ***"}
