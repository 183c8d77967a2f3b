"""`vero.core.isolated_git`: the one boundary where git's failures become vero's."""

from __future__ import annotations

import os

import git
import pytest
from _support.git import commit_file
from _support.git import git as run_git  # `git` is GitPython here

from vero.core.isolated_git import IsolatedGit, commit_trees, private_git_env
from vero.errors import GitFailed, VeroError


def test_git_failures_leave_as_gitfailed_never_as_gitpythons(tmp_path):
    with private_git_env(safe_directories=[tmp_path]) as (env, _):
        runner = IsolatedGit(tmp_path, env=env, git_dir=tmp_path / "absent.git")
        with pytest.raises(GitFailed) as raised:
            runner.rev_parse("--verify", "HEAD")
    error = raised.value
    assert isinstance(error, VeroError) and not isinstance(error, git.GitCommandError)
    assert (error.command, error.status) == ("rev-parse", 128)
    assert "not a git repository" in error.stderr
    assert str(error) == "git rev-parse failed (exit 128)"  # no path or output in the message


def test_commit_trees_reads_known_commits_and_leaves_out_the_rest(tmp_path):
    repo = tmp_path / "repo"
    commit = commit_file(repo, "a.txt", "a\n", "a")
    tree = run_git(repo, "rev-parse", "HEAD^{tree}")
    assert commit_trees(repo, [commit, "f" * 40, "--output=x"]) == {commit: tree}
    assert commit_trees(repo / ".git", [commit], bare=True) == {commit: tree}
    assert not (repo / "x").exists()


@pytest.mark.timeout(60)
def test_a_command_past_its_time_limit_is_killed_with_its_process_group(tmp_path):
    run_git(tmp_path, "init", "-q")
    read_end, write_end = os.pipe()  # kept open: the command waits for its input forever
    try:
        with private_git_env(safe_directories=[tmp_path]) as (env, _), os.fdopen(read_end, "rb") as stdin:
            runner = IsolatedGit(tmp_path, env=env, git_dir=tmp_path / ".git", timeout_sec=0.5)
            with pytest.raises(GitFailed) as raised:
                runner.hash_object("--stdin", istream=stdin)
            written = runner.hash_object("--stdin", istream=b"x")  # bytes in: no temporary file
            assert written == run_git(tmp_path, "hash-object", "--stdin", input=b"x")
    finally:
        os.close(write_end)
    assert (raised.value.command, raised.value.status) == ("hash-object", None)
    assert "killed after 0.5 s" in raised.value.stderr


def test_commands_get_exactly_the_runners_environment(tmp_path, monkeypatch):
    run_git(tmp_path, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("VERO_TEST_LEAK", "1")
    with private_git_env(safe_directories=[tmp_path]) as (env, _):
        runner = IsolatedGit(tmp_path, env=env, git_dir=tmp_path / ".git")
        shown = dict(
            line.split("=", 1) for line in runner.execute(["git", "-c", "alias.showenv=!env", "showenv"]).splitlines()
        )
        assert runner.rev_parse("--absolute-git-dir") == str(tmp_path / ".git")
    # nothing of the caller's: the runner's variables, what git and the shell add for an alias
    assert "VERO_TEST_LEAK" not in shown and shown["HOME"] == env["HOME"]
    assert {k for k in shown if not k.startswith("GIT_")} <= {*env, "PWD", "SHLVL", "_"}
    assert shown["GIT_DIR"] == str(tmp_path / ".git")
