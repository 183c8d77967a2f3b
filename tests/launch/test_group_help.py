"""`vero --help`, `vero harbor --help` and the commands' `--help` without typer, and the typer
application built per command.

The pages `vero.commands.group_help` prints must be the ones typer prints (same commands, summaries,
options and layout, exit codes) wherever it prints them; a call of one command must behave as in the
whole application.
"""

from __future__ import annotations

import pytest
from _support.cli import run_vero
from typer.testing import CliRunner

from vero.agent_cli import HELP as AGENT_HELP
from vero.cli import app, build_app
from vero.commands.group_help import command_help, group_help, static_help, typer_command_pages
from vero.commands.help_pages import PAGES, WIDTH
from vero.commands.registry import COMMANDS

pytestmark = pytest.mark.timeout(300)

PLAIN = {"TTY_COMPATIBLE": "0"}
"""Whatever the test's own stdout is, rich writes plain text (as into an agent's pipe)."""


def _typer_page(path: tuple[str, ...], columns: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="vero", env={**PLAIN, "COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", [(), ("harbor",)])
def test_group_pages_are_typers_at_every_width(path: tuple[str, ...]) -> None:
    printed = 0
    for columns in (*range(30, 131, 7), 80, 100, 200, 300):
        page = group_help(path, env={**PLAIN, "COLUMNS": str(columns)}, prog="vero")
        if page is not None:
            printed += 1
            assert page == _typer_page(path, columns), columns
    assert printed >= 12  # only the narrowest widths are left to typer


def test_group_pages_name_every_registered_command() -> None:
    harbor = group_help(("harbor",), env={**PLAIN, "COLUMNS": "300"}, prog="vero")
    root = group_help((), env={**PLAIN, "COLUMNS": "300"}, prog="vero")
    assert harbor is not None and root is not None
    assert _first_column(harbor) == ["--help", *(e.name for e in COMMANDS if e.group == "harbor")]
    assert len(_first_column(harbor)) == 13
    assert _first_column(root) == ["--help", "report", "harbor"]


def _first_column(page: str) -> list[str]:
    """The options and commands a page lists (the first word of each panel row that starts one)."""
    return [line[2:].split(" ", 1)[0] for line in page.splitlines() if line.startswith("│ ") and line[2] != " "]


def test_agent_summaries_are_the_agent_clis_help() -> None:
    agent = {e.name: e.summary for e in COMMANDS if e.function is None}
    assert agent == {n: f"{h} (`vero harbor {n} --help` lists the options.)" for n, h in AGENT_HELP.items()}


def test_typer_prints_a_terminals_page() -> None:
    """Colours (a terminal, or forced) and unknown widths are typer's to print."""
    assert group_help((), env={"FORCE_COLOR": "1", "COLUMNS": "80"}, prog="vero") is None
    assert group_help((), env={"TTY_COMPATIBLE": "1", "COLUMNS": "80"}, prog="vero") is None
    assert group_help((), env={**PLAIN, "COLUMNS": "eighty"}, prog="vero") is None
    assert group_help(("harbor", "build"), env=PLAIN, prog="vero") is None


def test_the_console_script_prints_typers_page() -> None:
    for path in ((), ("harbor",)):
        done = run_vero(*path, "--help", env={"COLUMNS": "90"})
        assert done.returncode == 0, done.stderr
        assert done.stdout == _typer_page(path, 90)
    forced = run_vero("--help", env={"COLUMNS": "90", "FORCE_COLOR": "1"})
    assert forced.returncode == 0 and "\x1b[" in forced.stdout  # typer's coloured page


@pytest.mark.parametrize("entry", COMMANDS, ids=lambda e: f"{e.group} {e.name}".strip())
def test_one_command_app_behaves_as_the_whole(entry) -> None:
    path = [entry.group, entry.name] if entry.group else [entry.name]
    alone = build_app(entry)[0]
    for args in (["--help"], ["--no-such-option"]):
        whole = CliRunner().invoke(app, [*path, *args], prog_name="vero", env={**PLAIN, "COLUMNS": "100"})
        single = CliRunner().invoke(alone, [*path, *args], prog_name="vero", env={**PLAIN, "COLUMNS": "100"})
        assert (single.exit_code, single.output) == (whole.exit_code, whole.output)


def test_stored_command_pages_are_typers() -> None:
    """Fails when a command's options or help changed without `python -m vero.commands.group_help --write`."""
    typer_paths = {(e.group, e.name) if e.group else (e.name,) for e in COMMANDS if e.function is not None}
    assert set(PAGES) == typer_paths
    assert typer_command_pages(WIDTH) == PAGES


@pytest.mark.parametrize("path", sorted(PAGES), ids=" ".join)
def test_the_console_script_prints_typers_command_page(path: tuple[str, ...]) -> None:
    widths = (WIDTH, 100) if path == ("harbor", "build") else (WIDTH,)  # a stored page, then typer's
    for columns in widths:
        done = run_vero(*path, "--help", env={} if columns == WIDTH else {"COLUMNS": str(columns)})
        assert done.returncode == 0, done.stderr
        assert done.stdout == _typer_page(path, columns)


@pytest.mark.parametrize("path", [(), ("harbor",)])
def test_a_group_without_a_command_prints_typers_page(path: tuple[str, ...]) -> None:
    typer = CliRunner().invoke(app, list(path), prog_name="vero", env={**PLAIN, "COLUMNS": "80"})
    assert typer.exit_code == 2
    done = run_vero(*path, env={"COLUMNS": "80"})
    assert (done.returncode, done.stdout, done.stderr) == (2, typer.output, "")
    assert static_help(list(path), env={**PLAIN, "COLUMNS": "80"}, prog="vero") == (typer.output, 2)


def test_typer_prints_other_command_pages() -> None:
    """Another width, a terminal, another program name, an agent command: not a stored page."""
    plain = {**PLAIN, "COLUMNS": str(WIDTH)}
    assert command_help(("harbor", "build"), env=plain, prog="vero") == PAGES[("harbor", "build")]
    assert command_help(("harbor", "build"), env={**plain, "COLUMNS": "81"}, prog="vero") is None
    assert command_help(("harbor", "build"), env={**plain, "TTY_COMPATIBLE": "1"}, prog="vero") is None
    assert command_help(("harbor", "build"), env=plain, prog="python -m vero._entry") is None
    assert command_help(("harbor", "status"), env=plain, prog="vero") is None
    assert static_help(["harbor", "build", "-c", "x.yaml"], env=plain, prog="vero") is None
    assert static_help(["harbor", "nope", "--help"], env=plain, prog="vero") is None
