"""`vero-harbor-run` (`vero.harbor.nested_cli`) is Harbor's `harbor run`, minus Harbor's other commands.

Harbor's application and the entry's side by side in one process, and the installed script as a
process (no Docker: what is compared ends before a trial starts; every Docker test of
`HarborBackend()` runs its jobs through the entry).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

from vero.harbor import HarborBackend
from vero.harbor.command import find_harbor_executable, find_nested_harbor_executable
from vero.harbor.nested_cli import SCRIPT_NAME, _flag_names, build_app

pytestmark = pytest.mark.timeout(180)

BIN = Path(sys.executable).parent
ENV = {"HARBOR_TELEMETRY": "0", "PATH": "/usr/bin:/bin", "NO_COLOR": "1", "COLUMNS": "100"}


def _run(executable: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(executable), *args], capture_output=True, text=True, env=ENV, timeout=120)


def _params(command: click.Command) -> list[tuple]:
    return [(p.name, tuple(p.opts), tuple(p.secondary_opts), repr(p.default), p.required) for p in command.params]


def test_the_run_command_is_harbors_own():
    from harbor.cli.main import app as harbor_app

    ours = typer.main.get_command(build_app())
    theirs = typer.main.get_command(harbor_app)
    assert ours.commands["run"].callback.__wrapped__ is theirs.commands["run"].callback.__wrapped__
    assert _params(ours.commands["run"]) == _params(theirs.commands["run"])
    assert len(_params(ours.commands["run"])) > 20  # Harbor's options, not an empty command
    assert ours.context_settings == theirs.context_settings


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "-y", "-q", "-p", "/x", "-i", "[a]b", "--ak", "k=-v", "-e", "docker", "--", "-n"],
        ["run", "--job-name=j", "-o", "/o", "-k", "2", "--agent-timeout-multiplier", "1.5", "-y"],
    ],
)
def test_telemetry_names_the_flags_harbor_names(argv):
    from harbor.cli.main import _command_telemetry_from_argv
    from harbor.cli.main import app as harbor_app

    def context(app: typer.Typer) -> typer.Context:
        group = typer.main.get_command(app)
        return group.make_context("harbor", list(argv), resilient_parsing=True)

    path, flags = _command_telemetry_from_argv(context(harbor_app), argv)
    assert path == "run" and "-y" in flags
    assert _flag_names(context(build_app()), argv) == flags


@pytest.mark.parametrize(
    "argv",
    [["run", "--no-such-option"], ["run", "-y", "-q", "-p", "/nonexistent-vero-cases", "-a", "oracle"], ["run", "-h"]],
)
def test_a_run_reads_as_harbors(argv):
    """The same exit, output and exception as Harbor's application, in one process (a bad option, a
    missing cases dir, the help)."""
    from harbor.cli.main import app as harbor_app
    from typer.testing import CliRunner

    def invoke(app: typer.Typer):
        return CliRunner().invoke(app, argv, prog_name="harbor", env={"HARBOR_TELEMETRY": "0", "COLUMNS": "100"})

    theirs, ours = invoke(harbor_app), invoke(build_app())
    assert (ours.exit_code, ours.output) == (theirs.exit_code, theirs.output)
    assert type(ours.exception) is type(theirs.exception)
    assert theirs.output or theirs.exception is not None


def test_the_script_runs_harbors_run_and_hands_other_commands_to_harbor():
    """The installed script: a refused run names `harbor run` as Harbor's script does; `--version`
    (not `run`) is answered by Harbor's application."""
    from importlib.metadata import version

    refused = _run(BIN / SCRIPT_NAME, "run", "--no-such-option")
    assert refused.returncode == 2 and "Usage: harbor run" in refused.stderr, refused
    assert "No such option: --no-such-option" in refused.stderr
    answered = _run(BIN / SCRIPT_NAME, "--version")
    assert answered.returncode == 0 and answered.stdout.strip() == version("harbor"), answered


def test_the_entry_imports_none_of_harbors_other_commands():
    probe = (
        "import sys; sys.argv = ['vero-harbor-run', 'run', '--help']\n"
        "from vero.harbor.nested_cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('harbor.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV, timeout=120)
    loaded = done.stdout.strip().splitlines()[-1]
    assert "'harbor.cli.jobs'" in loaded
    for module in ("harbor.cli.main", "harbor.cli.hub", "harbor.cli.publish", "harbor.cli.view", "harbor.cli.serve"):
        assert f"'{module}'" not in loaded, loaded


def test_nested_runs_start_through_the_entry_by_default():
    assert find_nested_harbor_executable() == BIN / SCRIPT_NAME
    assert HarborBackend().harbor_executable == BIN / SCRIPT_NAME
    assert HarborBackend().python_executable == BIN / "python"
    # `vero harbor run`'s outer run keeps Harbor's own script.
    assert find_harbor_executable() == BIN / "harbor"
