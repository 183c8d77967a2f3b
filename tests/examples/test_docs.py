"""The docs stay true where a test can tell: every module is in the architecture page, the README
stays short, and every plain `harbor` command the docs show turns LiteLLM's cost-map fetch off.

Harbor imports LiteLLM, which fetches its model cost map from the network at import unless
`LITELLM_LOCAL_MODEL_COST_MAP=True`: offline that prints about 8 s of retries before anything runs.
`vero` sets the variable for every Harbor process it starts (`vero.launch`, nested runs); a
`harbor` command the reader types needs it on the command line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tasks").glob("*/README.md")])
_FENCE = re.compile(r"^```(\w*)")
_ENV = "LITELLM_LOCAL_MODEL_COST_MAP=True"
# `harbor <verb>` as a command: at the start of a shell line after variable assignments, or after `uv run`.
_COMMAND = re.compile(r"(?:^\s*(?:[A-Z_]+=\S*\s+)*|uv run\s+)harbor\s+(?:run|lint|jobs|trials|tasks|view)\b")
_INLINE = re.compile(r"`([^`]*\buv run harbor\b[^`]*)`")


def commands(text: str) -> list[str]:
    """The shell commands (continuation lines joined) of `bash` blocks, and inline `uv run harbor ...` spans."""
    found: list[str] = []
    prose: list[str] = []
    in_block = in_shell = False
    current = ""
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence:
            in_shell = not in_block and fence.group(1) in ("bash", "sh", "shell")
            in_block = not in_block
            continue
        if not in_block:
            prose.append(line)
        elif in_shell:
            current += line.rstrip("\\") + " "
            if not line.endswith("\\"):
                found.append(" ".join(current.split()))
                current = ""
    found += [m.group(1) for m in _INLINE.finditer(" ".join(" ".join(prose).split()))]
    return [c for c in found if _COMMAND.search(c)]


def test_the_scan_finds_commands_and_their_environment():
    page = "```bash\nuv run harbor run -p x \\\n  -a y\nuv run vero harbor run -c z\n```\nsee `uv run harbor lint t`.\n"
    assert commands(page) == ["uv run harbor run -p x -a y", "uv run harbor lint t"]


def test_every_plain_harbor_command_in_the_docs_sets_the_local_cost_map():
    missing = [
        f"{page.relative_to(ROOT)}: {command.strip()}"
        for page in DOCS
        for command in commands(page.read_text())
        if _ENV not in command
    ]
    assert not missing, "\n".join(missing)


def test_every_module_of_src_vero_is_named_in_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        parts = path.relative_to(ROOT / "src").with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    missing = [m for m in modules if f"`{m}`" not in page and f"`{m} " not in page and f"`{m}." not in page]
    assert not missing, f"modules docs/architecture.md does not name: {missing}"


def test_the_readme_stays_a_ten_minute_read():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_the_case_docs_cases_shows_is_the_example_s_files_as_they_are():
    page = (ROOT / "docs" / "cases.md").read_text()
    case = ROOT / "tasks" / "minimal" / "cases" / "words-basic"
    for rel in ("task.toml", "environment/Dockerfile", "instruction.md", "tests/test.sh"):
        shown = re.search(rf"^`{re.escape(rel)}`:\n\n```\w*\n(.*?)\n```$", page, re.S | re.M)
        assert shown is not None, f"docs/cases.md does not show {rel}"
        assert shown.group(1) == (case / rel).read_text().rstrip(), f"docs/cases.md shows an old {rel}"
