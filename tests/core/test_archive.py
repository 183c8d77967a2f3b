"""Canonical archives: links that leave the tree are refused, also through a chain of links."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from vero.core.archive import ArchiveError, canonical_tar_bytes, symlink_escapes
from vero.errors import VeroError


def _tree(root: Path, links: dict[str, str]) -> Path:
    (root / "deep" / "er").mkdir(parents=True)
    (root / "y").write_text("y\n")
    for rel, target in links.items():
        (root / rel).symlink_to(target)
    return root


@pytest.mark.parametrize(
    "links",
    [
        {"out": "../x"},
        {"abs": "/etc/passwd"},
        {
            "deep/er/up": "../../..",
        },
        # Each target alone stays inside; followed through `deep/er/up` (the root) it leaves the tree.
        {"deep/er/up": "../..", "x": "deep/er/up/../y"},
        {"a": "b/x", "b": "a/y"},  # a loop fails closed
    ],
    ids=["dotdot", "absolute", "nested-dotdot", "chain", "loop"],
)
def test_links_leaving_the_tree_are_refused(tmp_path, links):
    with pytest.raises(ArchiveError, match="link leaves the tree") as info:
        canonical_tar_bytes(_tree(tmp_path / "t", links))
    # One of vero's errors (the CLI reports it by type), and a ValueError for callers that expect one.
    assert isinstance(info.value, VeroError) and isinstance(info.value, ValueError)


def test_links_inside_the_tree_are_kept_as_links(tmp_path):
    root = _tree(tmp_path / "t", {"deep/er/up": "../..", "top": "deep/er/up/y", "dangling": "not/there"})
    with tarfile.open(fileobj=io.BytesIO(canonical_tar_bytes(root))) as tar:
        links = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
    assert links == {"deep/er/up": "../..", "top": "deep/er/up/y", "dangling": "not/there"}


def test_symlink_escapes_follows_the_other_links():
    links = {b"deep/up": b"..", b"x": b"deep/up/../y"}
    assert symlink_escapes(b"x", links[b"x"], links)
    assert not symlink_escapes(b"deep/up", links[b"deep/up"], links)
    assert not symlink_escapes(b"z", b"deep/up/y", links)
