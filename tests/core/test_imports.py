"""`vero.core` is the trusted core: no web framework, HTTP client, CLI toolkit or Harbor (DESIGN §3)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN = ("fastapi", "httpx", "typer", "harbor", "starlette", "uvicorn")
CORE_MODULES = ("vero.core", "vero.core.policy", "vero.core.ledger", "vero.core.jobs", "vero.core.storage",
                "vero.core.evaluation", "vero.core.archive", "vero.core.candidates", "vero.core.session",
                "vero.core.baseline")


@pytest.mark.timeout(60)
def test_core_imports_stay_light_in_a_fresh_interpreter():
    code = (
        "import importlib, json, sys\n"
        f"for name in {CORE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []

