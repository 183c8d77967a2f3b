"""docs/spec.md's field reference is what the spec models say (`vero.spec.reference`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vero.spec.reference import BEGIN, END, reference_rows, render_table, update_page

PAGE = Path(__file__).resolve().parents[2] / "docs" / "spec.md"


def test_the_committed_page_is_current():
    page = PAGE.read_text()
    assert update_page(page) == page, "docs/spec.md is stale: run `uv run python -m vero.spec.reference docs/spec.md`"


def test_every_field_has_a_meaning_and_a_required_or_default_entry():
    rows = reference_rows()
    undocumented = [path for path, _type, _default, meaning in rows if not meaning]
    assert not undocumented, f"fields without a docstring: {undocumented}"
    assert all(default for _path, _type, default, _meaning in rows)
    paths = {path for path, *_ in rows}
    # Every kind's fields, mappings' values and nested sections are reached.
    for path in (
        "target.install_command",
        "target.agent_import_path",
        "target.limits.max_file_bytes",
        "agent_access.<partition>.ladder.margin",
        "targets.<partition>.reward_key",
        "inference.models.<model>.provider",
        "inference.providers.<provider>.api_key_secret",
    ):
        assert path in paths
    by_path = {path: (default, meaning) for path, _type, default, meaning in rows}
    assert by_path["name"][0] == "**required**"
    assert by_path["scoring.reward_key"][0] == "`reward`"
    assert by_path["target.install_command"][1].startswith("`kind: program` only.")


def test_pipes_in_a_meaning_do_not_split_the_table():
    for line in render_table().splitlines()[2:]:
        assert line.replace("\\|", "").count("|") == 5, line


def test_a_page_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        update_page("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        update_page(f"{END}\n{BEGIN}\n")
