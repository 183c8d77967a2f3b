"""How the agent CLI reads its input: the quick parser (`vero.agent_cli._quick_parse`) reads a call
exactly as argparse would, or declines it and leaves it to argparse (help, abbreviations, bad values,
errors); the sidecar URL is refused with a clear message unless it is a plain http URL."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vero.agent_cli import _ARGUMENTS, Sidecar, _quick_parse, build_parser
from vero.errors import SidecarUnavailable

VALUES = ("train", "HEAD", "", "0", "1", "-1", "0.01", "2.5", "x", "101", "complete", "nope", "a b", "-x", "t1")
ODD = ("--help", "-h", "--", "-", "--part", "--wai", "--ca", "--js", "-ptrain", "-p=train", "--bogus", "extra")


def _argparse(argv: list[str]) -> dict | None:
    """What argparse makes of `argv` (None when it refuses it or prints help)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return vars(build_parser(argv[0]).parse_args(argv))
    except SystemExit:
        return None


def _pieces(command: str) -> st.SearchStrategy[list[str]]:
    """Pieces of a call: an option with a value (`--name value`, `--name=value`, `-n value`), a flag,
    a positional word, or an odd token; mostly well-formed, so that both parsers' answers are compared."""
    with_value, flags = [], []
    for option, kwargs in _ARGUMENTS[command]:
        if option[0].startswith("-"):
            (flags if kwargs.get("action", "store").startswith("store_") else with_value).extend(option)
    value = st.sampled_from(VALUES)
    pieces = [st.tuples(st.sampled_from(with_value), value).map(list)] if with_value else []
    pieces += [
        st.tuples(st.sampled_from([f for f in with_value if f.startswith("--")] or ["--url"]), value).map(
            lambda pair: [f"{pair[0]}={pair[1]}"]
        ),
        st.sampled_from(flags).map(lambda flag: [flag]),
        value.map(lambda word: [word]),
        st.sampled_from(ODD).map(lambda token: [token]),
    ]
    return st.one_of(pieces)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(data=st.data(), command=st.sampled_from(sorted(_ARGUMENTS)))
def test_quick_parse_agrees_with_argparse_or_declines(data: st.DataObject, command: str) -> None:
    pieces = data.draw(st.lists(_pieces(command), max_size=6))
    argv = [command, *(token for piece in pieces for token in piece)]
    quick = _quick_parse(argv)
    expected = _argparse(argv)
    if quick is not None:
        assert expected is not None, argv
        assert vars(quick) == expected, argv


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--text", "--url", "http://eval-sidecar:8000"],
        ["eval", "--partition", "train", "--wait"],
        ["eval", "-p", "train", "-c", "t1", "-c", "t2", "--timeout-sec", "30", "--poll-interval-sec", "0.5"],
        ["eval", "--partition=train", "--block", "0", "-b", "2", "--version", "main", "--json"],
        ["result", "job-1", "--wait"],
        ["result", "-w", "job-1", "--text"],
        ["submit"],
        ["submit", "-v", "HEAD~1"],
        ["evaluations", "--limit=5", "--state", "complete", "-p", "train", "--all"],
        ["evaluations", "--before", "abc", "-n", "100"],
    ],
)
def test_the_agents_usual_calls_take_the_quick_path(argv: list[str]) -> None:
    quick = _quick_parse(argv)
    assert quick is not None
    assert vars(quick) == _argparse(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["eval"],  # --partition is required: argparse's message
        ["eval", "-p", "train", "--timeout-sec", "-1"],
        ["eval", "-p", "train", "--poll-interval-sec", "0.01"],
        ["evaluations", "--limit", "0"],
        ["evaluations", "--state", "nope"],
        ["result"],
        ["result", "a", "b"],
        ["status", "--help"],
        ["status", "--wait"],
        ["status", "--json=yes"],
        ["eval", "--part", "train"],
        ["eval", "-p", "--wait"],
    ],
)
def test_anything_unusual_is_left_to_argparse(argv: list[str]) -> None:
    assert _quick_parse(argv) is None


@pytest.mark.parametrize(
    "url", ["ftp://x", "eval-sidecar:8000", "http://user@x", "http://x:y", "http://x:0", "http://[::1", "http://bü..x"]
)
def test_a_malformed_sidecar_url_is_refused_naming_it(url: str) -> None:
    with pytest.raises(SidecarUnavailable, match=r"the sidecar URL .* is not an absolute http URL .*VERO_SIDECAR_URL"):
        Sidecar(url)


@pytest.mark.parametrize(
    ("url", "address", "port", "prefix"),
    [
        ("http://eval-sidecar:8000", b"eval-sidecar", 8000, ""),
        ("http://[::1]:9000/vero/", b"::1", 9000, "/vero"),
        ("http://bücher.example", b"xn--bcher-kva.example", 80, ""),
    ],
)
def test_a_sidecar_url_gives_the_address_to_connect_to(url: str, address: bytes, port: int, prefix: str) -> None:
    sidecar = Sidecar(url)
    assert (sidecar._address, sidecar._port, sidecar._prefix) == (address, port, prefix)
