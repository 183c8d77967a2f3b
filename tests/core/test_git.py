"""`vero.core.isolated_git`: the one boundary where git's failures become vero's."""

from __future__ import annotations

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
