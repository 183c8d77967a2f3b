"""Evaluation slots (`vero.sidecar.slots`): warmed with the baseline in the background at start,
handed out warm first, each its own copy of the tree (what a candidate does to one slot is seen by
no other), and the warm-up ends with intake."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

import pytest
from _support.worktree import plant_git, rewrite_keeping_times, seal_of_another_boot, swap_directories

from vero.core.candidates import CandidateStore
from vero.core.worktree_seal import changed_since, read_seal
from vero.sidecar.models import EvaluationRequest
from vero.sidecar.slots import SlotPool, warm_slots

from ._server import StubBackend, commit_file, git, make_harness

pytestmark = pytest.mark.timeout(120)

BASELINE = {f"pkg{i // 10}/mod{i % 10}.py": f"VALUE = {i}\n" for i in range(30)} | {"solve.py": "print(0)\n"}


def _blob_ids(root: Path) -> dict[str, str]:
    """Path -> the blob id of each file's bytes on disk (`hash-object --no-filters`)."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    names = "\n".join(str(p) for p in files).encode()
    command = ["git", "hash-object", "--no-filters", "--stdin-paths"]
    ids = subprocess.run(command, input=names, capture_output=True, check=True, timeout=60).stdout.split()
    return {p.relative_to(root).as_posix(): oid.decode() for p, oid in zip(files, ids, strict=True)}


def _listed_blobs(store: CandidateStore, commit: str) -> dict[str, str]:
    listing = git(store.git_dir, "ls-tree", "-r", commit)
    return {line.split("\t")[1]: line.split()[2] for line in listing.splitlines()}


def _written(root: Path) -> dict[str, tuple[int, int]]:
    """Path -> (inode, ctime in ns) of each file: both stay while a file is not written again."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_ctime_ns) for p in root.rglob("*") if p.is_file()
    }


def test_every_slot_is_warmed_with_the_baseline_and_its_first_job_writes_only_what_changed(tmp_path):
    """After start, without any evaluation, every slot holds the baseline's bytes (as `git ls-tree`
    lists them) in files of its own; a restart leaves warm slots as they are; each slot's first job
    rewrites only the file its candidate changed."""
    backend = StubBackend(block=threading.Event())
    harness = make_harness(tmp_path, backend=backend, baseline_files=BASELINE)
    harness.max_concurrent_evaluations = 3
    slots = [harness.work_dir / "checkouts" / f"slot-{n}" for n in range(3)]

    async def scenario() -> None:
        service = harness.service()
        await service.start()
        await service.runner.warmed()
        store, baseline = service.candidates, harness.config.baseline_commit
        expected = _listed_blobs(store, baseline)
        owners: dict[int, Path] = {}
        for n, slot in enumerate(slots):
            assert (
                CandidateStore.indexed_tree(harness.state_dir / "checkouts" / f"slot-{n}.index")
                == store.get(baseline).tree
            )
            assert _blob_ids(slot) == expected, slot
            for path in slot.rglob("*"):
                info = path.stat()
                assert info.st_mode & 0o555 == (0o555 if path.is_dir() else 0o444), path  # the runner reads it
                if path.is_file():
                    assert info.st_nlink == 1, path
                    assert owners.setdefault(info.st_ino, slot) == slot, f"{path} shares an inode with another slot"
        await service.stop()

        warm = {slot: _written(slot) for slot in slots}
        service = harness.service()
        await service.start()
        await service.runner.warmed()
        assert {slot: _written(slot) for slot in slots} == warm  # already warm: nothing rewritten

        moved = []
        checkout = service.runner._checkout

        def recorded_checkout(*args, **kwargs):
            moved.append(checkout(*args, **kwargs))
            return moved[-1]

        service.runner._checkout = recorded_checkout
        version = commit_file(harness.agent_repo, "pkg1/mod3.py", "VALUE = 'changed'\n", "one file")
        for _ in slots:  # each job holds its slot (the backend blocks), so the next takes another
            await service.start_evaluation("agent", EvaluationRequest(partition="train", version=version))
            assert await asyncio.to_thread(backend.started.acquire, True, 30)
        assert sorted(run.candidate_dir for run in backend.runs) == slots
        for slot in slots:
            now = _written(slot)
            assert (slot / "pkg1" / "mod3.py").read_text() == "VALUE = 'changed'\n"
            assert now["pkg1/mod3.py"] != warm[slot]["pkg1/mod3.py"]  # written again (a new ctime)
            del now["pkg1/mod3.py"], warm[slot]["pkg1/mod3.py"]
            assert now == warm[slot]  # every other file as the warm-up wrote it
        tree = service.candidates.get(version).tree
        backend.block.set()
        await service.stop()
        # each job recorded its slot's index (during its run): the slot is warm at the new tree,
        # sealed there by its job (`vero.core.worktree_seal`); every slot made the move sealed (read
        # once, by the store's kept `cat-file`: no git process)
        for n in range(len(slots)):
            index = harness.state_dir / "checkouts" / f"slot-{n}.index"
            assert CandidateStore.indexed_tree(index) == tree
            seal = read_seal(index)
            assert seal is not None and seal.tree == tree and changed_since(slots[n], seal) == []
        assert [update.sealed for update in moved] == [True] * len(slots)

    asyncio.run(scenario())


def test_what_a_candidate_writes_through_its_slot_no_other_slot_and_no_later_evaluation_sees(tmp_path):
    """The worst a candidate could do through its slot (were it writable: it is the runner's, read
    only): rewrite a file in place, replace one, delete one. Every other slot still holds the tree's
    bytes, and the next evaluation in that slot gets them back."""
    backend = StubBackend(block=threading.Event())
    harness = make_harness(tmp_path, backend=backend, baseline_files=BASELINE)
    harness.max_concurrent_evaluations = 2
    slot_0, slot_1 = (harness.work_dir / "checkouts" / f"slot-{n}" for n in range(2))

    async def scenario() -> None:
        service = harness.service()
        await service.start()
        await service.runner.warmed()
        expected = _listed_blobs(service.candidates, harness.config.baseline_commit)
        with (slot_0 / "pkg0" / "mod1.py").open("r+") as written_in_place:
            written_in_place.write("import os; os.system('x')\n")
        (slot_0 / "solve.py").unlink()
        (slot_0 / "solve.py").write_text("print('forged')\n")
        (slot_0 / "pkg2" / "mod9.py").unlink()
        assert _blob_ids(slot_1) == expected

        await service.start_evaluation(
            "agent", EvaluationRequest(partition="train", version=harness.config.baseline_commit)
        )
        assert await asyncio.to_thread(backend.started.acquire, True, 30)
        assert backend.runs[0].candidate_dir == slot_0  # both warm: the lowest first
        assert _blob_ids(slot_0) == expected and _blob_ids(slot_1) == expected
        backend.block.set()
        await service.stop()

    asyncio.run(scenario())


def test_closing_intake_ends_the_warm_up_after_the_slot_it_is_writing(tmp_path, monkeypatch):
    harness = make_harness(tmp_path, baseline_files=BASELINE)
    harness.max_concurrent_evaluations = 3
    writing, go_on = threading.Event(), threading.Event()
    warmed: list[int] = []

    async def scenario() -> None:
        service = harness.service()
        real = service.runner._checkout

        def held_checkout(candidate: str, slot: int) -> Path:
            writing.set()
            assert go_on.wait(30)
            warmed.append(slot)
            return real(candidate, slot)

        monkeypatch.setattr(service.runner, "_checkout", held_checkout)
        await service.start()
        assert await asyncio.to_thread(writing.wait, 30)
        await service.close_intake("agent_ended")
        go_on.set()
        await service.runner.warmed()
        await service.stop()

    asyncio.run(scenario())
    assert warmed == [0]
    indexes = harness.state_dir / "checkouts"
    assert [CandidateStore.indexed_tree(indexes / f"slot-{n}.index") is not None for n in range(3)] == [
        True,
        False,
        False,
    ]


def test_after_a_reboot_the_warm_up_writes_every_slot_whole_restoring_what_git_would_miss(tmp_path):
    """A slot's seal does not outlive a boot (`vero.core.worktree_seal`): after a reboot every slot
    is cold though its index names its tree, and the warm-up at start writes each one whole,
    restoring what git's stat check and `git clean` let through (a file rewritten to its size
    with its times put back, two directories swapped by renames, a planted `.git`)."""
    harness = make_harness(tmp_path, baseline_files=BASELINE)
    harness.max_concurrent_evaluations = 2
    slots = [harness.work_dir / "checkouts" / f"slot-{n}" for n in range(2)]
    indexes = [harness.state_dir / "checkouts" / f"slot-{n}.index" for n in range(2)]

    async def scenario() -> None:
        service = harness.service()
        await service.start()
        await service.runner.warmed()
        tree = service.candidates.get(harness.config.baseline_commit).tree
        expected = _listed_blobs(service.candidates, harness.config.baseline_commit)
        await service.stop()
        assert [CandidateStore.warm_tree(index) for index in indexes] == [tree, tree]

        for index in indexes:
            seal_of_another_boot(index)
        rewrite_keeping_times(slots[0] / "pkg0" / "mod1.py", b"VALUE = 7\n")
        swap_directories(slots[0] / "pkg1", slots[0] / "pkg2")  # files of the same sizes
        plant_git(slots[0] / "pkg0")
        assert [CandidateStore.indexed_tree(index) for index in indexes] == [tree, tree]
        assert [CandidateStore.warm_tree(index) for index in indexes] == [None, None]
        before = {slot: _written(slot) for slot in slots}

        service = harness.service()
        await service.start()
        await service.runner.warmed()
        for slot, index in zip(slots, indexes, strict=True):
            assert _blob_ids(slot) == expected, slot  # every file the tree's, nothing untracked
            now = _written(slot)
            assert all(now[path] != before[slot].get(path) for path in now), slot  # each written again
            seal = read_seal(index)
            assert seal is not None and seal.tree == tree and changed_since(slot, seal) == []
        await service.stop()

    asyncio.run(scenario())


def test_a_job_gets_a_warm_slot_before_a_cold_one_and_waits_first_come_first_served():
    warm = {2}

    async def scenario() -> None:
        pool = SlotPool(3, warm.__contains__)
        assert pool.warm() == {2}
        assert await pool.acquire() == 2  # the warm one, though not the lowest
        assert pool.take_cold({0}) == 1  # the warm-up's: a cold one it did not try yet
        assert pool.take_cold({0}) is None
        assert await pool.acquire() == 0
        assert pool.empty()
        first = asyncio.create_task(pool.acquire())
        cancelled = asyncio.create_task(pool.acquire())
        last = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        cancelled.cancel()
        warm.add(1)
        pool.release(1)  # now warm: asked again on release
        assert await first == 1 and pool.warm() == {1, 2}
        pool.release(0)
        assert await last == 0
        assert cancelled.cancelled()

    asyncio.run(scenario())


def test_a_cancelled_warm_up_finishes_the_slot_it_writes_and_a_failed_slot_stays_cold():
    warm: set[int] = set()
    writing, go_on = threading.Event(), threading.Event()

    def write(slot: int) -> None:
        if slot == 0:
            raise OSError("disk full")
        writing.set()
        assert go_on.wait(30)
        warm.add(slot)

    async def scenario() -> None:
        pool = SlotPool(3, warm.__contains__)
        task = asyncio.create_task(warm_slots(pool, write))
        assert await asyncio.to_thread(writing.wait, 30)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # the write of slot 1 is waited for
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert warm == {1} and pool.warm() == {1}
        assert sorted([await pool.acquire() for _ in range(3)]) == [0, 1, 2]  # every slot given back

    asyncio.run(scenario())


def test_a_slots_changed_files_and_the_directories_above_them_are_made_readable(tmp_path):
    """`_make_readable` with the paths an update wrote: those files a+r (a+rx where the owner may
    execute) and every directory from the slot down to them 0755; a symlink (to a directory too),
    a directory off those paths and a path deleted with its directory are left as they are."""
    from vero.sidecar.runner import _make_readable

    root = tmp_path / "slot"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "off").mkdir()
    (root / "a" / "b" / "c" / "mod.py").write_text("x\n")
    (root / "a" / "b" / "run.sh").write_text("echo\n")
    (root / "a" / "top.py").write_text("y\n")
    (root / "linked").symlink_to(root / "off", target_is_directory=True)
    (root / "a" / "b" / "c" / "mod.py").chmod(0o600)
    (root / "a" / "b" / "run.sh").chmod(0o700)
    (root / "a" / "top.py").chmod(0o600)
    for directory in (root / "a" / "b" / "c", root / "a" / "b", root / "a", root / "off", root):
        directory.chmod(0o700)

    _make_readable(root, ("a/b/c/mod.py", "a/b/run.sh", "linked", "gone/deeper/file.py"))

    mode = {p: (root / p).lstat().st_mode & 0o777 for p in ("", "a", "a/b", "a/b/c", "off")}
    assert mode == {"": 0o755, "a": 0o755, "a/b": 0o755, "a/b/c": 0o755, "off": 0o700}
    assert (root / "a" / "b" / "c" / "mod.py").stat().st_mode & 0o777 == 0o644
    assert (root / "a" / "b" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "a" / "top.py").stat().st_mode & 0o777 == 0o600  # not among the changed
