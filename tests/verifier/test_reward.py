"""The reward file, failure values and the unprivileged identity of nested runs."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from verifier_bench import TableBackend, Workbench

from vero.core.run import RunAs
from vero.errors import InfrastructureFailure
from vero.harbor.process import runner_identity
from vero.verifier.reward import failure_rewards, reward_values, write_reward_file
from vero.verifier.scoring import hand_over, resolve_run_as

pytestmark = pytest.mark.timeout(120)


def test_reward_file_is_flat_json_and_replaces_a_planted_directory(tmp_path: Path) -> None:
    path = tmp_path / "verifier" / "reward.json"
    path.mkdir(parents=True)
    (path / "inner").write_text("x")
    write_reward_file(path, {"b": 2, "a": 0.5})
    assert path.is_file() and json.loads(path.read_text()) == {"a": 0.5, "b": 2.0}
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_reward_file_replaces_a_symlink_to_a_directory_without_touching_it(tmp_path: Path) -> None:
    target_dir = tmp_path / "elsewhere"
    target_dir.mkdir()
    (target_dir / "keep.txt").write_text("keep")
    path = tmp_path / "reward.json"
    path.symlink_to(target_dir)
    write_reward_file(path, {"reward": 1.0})
    assert not path.is_symlink() and json.loads(path.read_text()) == {"reward": 1.0}
    assert sorted(p.name for p in target_dir.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("bad", [{}, {"reward": math.nan}, {"reward": math.inf}])
def test_reward_file_refuses_what_harbor_cannot_read(tmp_path: Path, bad: dict) -> None:
    path = tmp_path / "reward.json"
    path.write_text('{"reward": 0.25}\n')
    with pytest.raises(ValueError):
        write_reward_file(path, bad)
    assert path.read_text() == '{"reward": 0.25}\n'


def test_failure_values_fill_unmeasured_and_non_finite_targets(bench: Workbench) -> None:
    config = bench.config(direction="minimize", failure_value=500.0, targets=("hidden", "hidden-b"))
    assert failure_rewards(config) == {"hidden": 500.0, "hidden-b": 500.0}
    assert reward_values(config, {"hidden": 3.0}) == {"hidden": 3.0, "hidden-b": 500.0}
    assert reward_values(config, {"hidden": math.nan, "hidden-b": None}) == {"hidden": 500.0, "hidden-b": 500.0}
    single = bench.config()
    assert failure_rewards(single) == {"reward": 0.0}


def test_run_as_takes_the_docker_socket_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        assert resolve_run_as("root") is None  # an unprivileged verifier keeps its identity
        return
    socket = tmp_path / "docker.sock"
    socket.write_text("")
    os.chown(socket, 0, 4242)
    run_as = resolve_run_as("root", docker_socket=socket)
    assert run_as == RunAs(uid=0, gid=0, extra_groups=(4242,), home=Path("/root"))
    assert resolve_run_as("root", docker_socket=tmp_path / "absent.sock").extra_groups == ()
    # A missing runner is no identity here (the verifier refuses the runs later), not an error.
    assert resolve_run_as("no-such-user-vero") is None
    with pytest.raises(InfrastructureFailure, match="no-such-user-vero"):
        runner_identity("no-such-user-vero")


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a tree to another uid needs root")
def test_nested_runs_get_their_checkout_and_jobs_dir_handed_over(bench: Workbench, tmp_path: Path) -> None:
    a = bench.candidate("a\n")
    bench.submit(a)
    archive = bench.seal()
    owners: list[tuple[int, int, int]] = []

    class Recording(TableBackend):
        async def evaluate(self, run):
            owners.append(
                (
                    run.candidate_dir.stat().st_uid,
                    (run.candidate_dir / "solution.txt").stat().st_uid,
                    run.jobs_dir.stat().st_uid,
                )
            )
            assert run.run_as is not None and run.run_as.uid == 54321
            return await super().evaluate(run)

    import asyncio

    from vero.verifier import VerifierPaths, verify

    out = tmp_path / "out"
    final = asyncio.run(
        verify(
            bench.config(),
            VerifierPaths(
                session_archive=archive,
                cases_dir=bench.cases_dir,
                baseline_dir=bench.baseline_files,
                reward_path=out / "reward.json",
                artifacts_dir=out / "artifacts",
                work_dir=out / "work",
            ),
            Recording({("hidden", bench.tree(a)): 0.5, ("hidden", bench.baseline_tree): 0.25}),
            run_as=RunAs(uid=54321, gid=54321, home=tmp_path),
        )
    )
    assert final.status == "scored" and final.run_as == "uid 54321"  # no account has that uid here
    assert owners == [(54321, 54321, 54321)] * 2  # both arms' checkouts (candidate and baseline)
    assert (out / "work").stat().st_mode & 0o777 == 0o711
    (session_dir,) = (out / "work").glob("session-*")
    assert session_dir.stat().st_uid == 0 and session_dir.stat().st_mode & 0o077 == 0


def test_hand_over_does_not_follow_links(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    hand_over(tree, RunAs(uid=777, gid=777, home=tmp_path))
    assert tree.stat().st_uid == 777 and (tree / "link").lstat().st_uid == 777
    assert outside.stat().st_uid == 0
