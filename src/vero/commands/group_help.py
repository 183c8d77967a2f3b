"""`vero --help`, `vero harbor --help` and each command's `--help` on the standard library, as typer
prints them into a pipe.

Typer renders a group's help with rich (usage, the help text, an Options and a Commands panel);
importing typer, click and rich for it costs about 40 times `python -c pass`, and an agent's tool
call runs `vero harbor --help` as readily as any other. When rich would print plain text (stdout is
no terminal and nothing forces one, a UTF-8 stdout, the usage on one line, every word fitting its
column) `group_help` lays the same page out from `vero.commands.registry`; otherwise it returns None
and the caller runs typer, which also colours the page on a terminal.
tests/launch/test_group_help.py compares both outputs at many widths.

The layout follows typer 0.29's `rich_utils.rich_format_help` and rich's `divide_line` word wrap.

A command's page (`vero harbor build --help`, ...) has too many shapes (option tables, wrapped
docstrings, truncated cells) to lay out here: `vero.commands.help_pages` holds the pages typer
prints at rich's default width of 80 for the console script, generated from the typer application
(`python -m vero.commands.group_help --write`); tests/launch/test_group_help.py fails when they are
not typer's. Another width, a terminal or another program name goes to typer.
"""

from __future__ import annotations

import os
import sys

from vero.commands.registry import APP_HELP, HARBOR_HELP, entries

TYPE_CHECKING = False  # `typing` and `collections.abc` cost start-up time; only type checkers read these
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

__all__ = ["command_help", "group_help", "static_help", "typer_command_pages"]

_HELP_OPTION = ("--help", "<bool>", "Show this message and exit.")
"""The one option of both groups: typer's help option (name, its type column, its help)."""

_MIN_DESCRIPTION_WIDTH = 20
"""Narrower than this, rich may resize the tables' columns; typer prints those pages."""


def _terminal_forced(env: Mapping[str, str]) -> bool | None:
    """typer's `FORCE_TERMINAL`, then rich's `Console.is_terminal` environment checks."""
    if env.get("_TYPER_FORCE_DISABLE_TERMINAL"):
        return False
    if env.get("GITHUB_ACTIONS") or env.get("FORCE_COLOR") or env.get("PY_COLORS"):
        return True
    if env.get("TTY_COMPATIBLE") in ("0", "1"):
        return env["TTY_COMPATIBLE"] == "1"
    if "FORCE_COLOR" in env:
        return False
    return None


def _plain_stdout(env: Mapping[str, str]) -> bool:
    """Whether rich would write plain text (no escape sequences, its Unicode boxes) to stdout."""
    forced = _terminal_forced(env)
    terminal = forced if forced is not None else sys.stdout.isatty()
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return not terminal and encoding.startswith("utf")


def _width(env: Mapping[str, str]) -> int:
    """rich's console width: `TERMINAL_WIDTH` (typer's), `COLUMNS`, the first terminal of stdin,
    stdout and stderr, else 80 (0 for a value rich would not take as it is)."""
    for name in ("TERMINAL_WIDTH", "COLUMNS"):
        value = env.get(name)
        if value:
            return int(value) if value.isdigit() else 0
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80


def _wrap(text: str, width: int) -> list[str] | None:
    """rich's word wrap (`divide_line`) of `text` into lines of at most `width` cells; None if a
    word is longer, or for what this copy does not follow (other whitespace than single spaces,
    characters of other widths than one cell, rich markup and emoji codes)."""
    words = text.split(" ")
    if not text.isascii() or not text.isprintable() or "" in words or "[" in text:
        return None
    if any(word.count(":") > 1 for word in words):  # rich might read `:name:` as an emoji
        return None
    lines: list[str] = []
    line = ""
    for word in words:
        if len(word) > width:
            return None
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    return [*lines, line]


def _program_name() -> str:
    """click's `_detect_program_name`: the script's name, or `python -m <module>`."""
    main = sys.modules["__main__"]
    path = sys.argv[0]
    package = getattr(main, "__package__", None)
    if package in (None, ""):
        return os.path.basename(path)
    name = os.path.splitext(os.path.basename(path))[0]
    module = package if name == "__main__" else f"{package}.{name}"
    return f"python -m {module.lstrip('.')}"


def _panel(title: str, rows: list[str], width: int) -> list[str]:
    top = f"╭─ {title} " + "─" * (width - len(title) - 5) + "╮"
    return [top, *(f"│ {row.ljust(width - 4)} │" for row in rows), "╰" + "─" * (width - 2) + "╯"]


def _table(rows: list[tuple[str, str]], first_width: int, width: int) -> list[str] | None:
    """Rows of a two-column table (`first_width` wide, then a wrapped text) inside a panel."""
    text_width = width - 4 - first_width
    if text_width < _MIN_DESCRIPTION_WIDTH:
        return None
    lines: list[str] = []
    for first, text in rows:
        wrapped = _wrap(text, text_width)
        if wrapped is None:
            return None
        lines += [(first if n == 0 else "").ljust(first_width) + part for n, part in enumerate(wrapped)]
    return lines


def _page(usage: str, help_text: str, commands: list[tuple[str, str]], width: int) -> str | None:
    if len(usage) > min(width - 2, 50):  # click or rich would wrap it
        return None
    described = _wrap(help_text, width - 2)
    name, kind, text = _HELP_OPTION
    option_prefix = name.ljust(len(name) + 8) + kind + "  "
    options = _table([(option_prefix, text)], len(option_prefix), width)
    name_width = max(len(command) for command, _ in commands)
    listed = _table([(f"{c.ljust(name_width)}  ", s) for c, s in commands], name_width + 2, width)
    if described is None or options is None or listed is None:
        return None
    blank = " " * width
    lines = [blank, f" {usage}".ljust(width), blank, *(f" {line}".ljust(width) for line in described), blank]
    lines += _panel("Options", options, width) + _panel("Commands", listed, width)
    # click echoes the (empty) rest of its help after rich printed the page: one more newline.
    return "".join(line + "\n" for line in lines) + "\n"


def group_help(path: tuple[str, ...], env: Mapping[str, str] | None = None, prog: str | None = None) -> str | None:
    """The page `<prog> <path> --help` prints (`path`: `()` or `("harbor",)`), or None when typer
    must print it (see the module docstring).

    `env` defaults to `os.environ`, `prog` to the name click would give this program (`vero` for
    the console script, `python -m vero._entry` for the module).
    """
    env = os.environ if env is None else env
    if path not in ((), ("harbor",)) or not _plain_stdout(env):
        return None
    group = path[0] if path else ""
    commands = [(e.name, e.summary) for e in entries(group)]
    if not path:
        commands.append(("harbor", HARBOR_HELP))
    usage = " ".join(["Usage:", prog or _program_name(), *path, "[OPTIONS] COMMAND [ARGS]..."])
    return _page(usage, HARBOR_HELP if path else APP_HELP, commands, _width(env))


def command_help(path: tuple[str, ...], env: Mapping[str, str] | None = None, prog: str | None = None) -> str | None:
    """The page `<prog> <path> --help` prints for a typer command (`path`: e.g. `("harbor", "build")`),
    from `vero.commands.help_pages`, or None when typer must print it (another width or program
    name than the stored pages', a terminal, an agent command or no command)."""
    env = os.environ if env is None else env
    if not _plain_stdout(env) or (prog or _program_name()) != "vero":
        return None
    from vero.commands.help_pages import PAGES, WIDTH

    page = PAGES.get(path)
    return page if page is not None and _width(env) == WIDTH else None


def static_help(
    argv: list[str], env: Mapping[str, str] | None = None, prog: str | None = None
) -> tuple[str, int] | None:
    """What a help call prints without typer: `(page, exit code)`, or None for typer to answer.

    `argv` (the arguments after the program name): `--help` of a group or a typer command, or a
    group without a command (`vero`, `vero harbor`: click prints the group's page without its
    last newline and exits 2).
    """
    if argv in ([], ["harbor"]):
        page = group_help(tuple(argv), env, prog)
        return None if page is None else (page[:-1], 2)
    if argv[-1:] != ["--help"]:
        return None
    path = tuple(argv[:-1])
    page = group_help(path, env, prog) if path in ((), ("harbor",)) else command_help(path, env, prog)
    return None if page is None else (page, 0)


def typer_command_pages(width: int = 80) -> dict[tuple[str, ...], str]:
    """Each typer command's `--help` page as typer prints it into a pipe `width` columns wide for
    the console script `vero` (the agent commands' pages are `vero.agent_cli`'s): path -> page."""
    from typer.testing import CliRunner

    from vero.cli import app
    from vero.commands.registry import COMMANDS

    pages: dict[tuple[str, ...], str] = {}
    for entry in COMMANDS:
        if entry.function is None:
            continue
        path = (entry.group, entry.name) if entry.group else (entry.name,)
        env = {"TTY_COMPATIBLE": "0", "COLUMNS": str(width)}
        result = CliRunner().invoke(app, [*path, "--help"], prog_name="vero", env=env)
        if result.exit_code != 0:
            raise RuntimeError(f"vero {' '.join(path)} --help exited {result.exit_code}: {result.output}")
        pages[path] = result.output
    return pages


def _write_pages(target: Path, width: int = 80) -> None:
    """Write `vero.commands.help_pages` (`target`) from the typer application."""
    import json

    lines = [
        '"""Each typer command\'s `--help` page, as typer prints it into a pipe 80 columns wide for `vero`.',
        "",
        "Generated from the typer application by `python -m vero.commands.group_help --write`; do not edit.",
        "`vero.commands.group_help.command_help` prints them; tests/launch/test_group_help.py checks they",
        "are typer's.",
        '"""',
        "",
        f"WIDTH = {width}",
        '"""The console width the pages were laid out for."""',
        "",
        "PAGES = {",
    ]
    for path, page in typer_command_pages(width).items():
        lines.append(f"    {path!r}: (")
        lines += [f"        {json.dumps(line, ensure_ascii=False)}" for line in page.splitlines(keepends=True)]
        lines.append("    ),")
    lines += ["}", '"""`vero <path> --help` -> its page."""', ""]
    target.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    import subprocess
    from pathlib import Path

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m vero.commands.group_help --write")
    written = Path(__file__).with_name("help_pages.py")
    _write_pages(written)
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(written)], check=True)
