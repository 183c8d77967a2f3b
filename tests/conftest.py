"""Shared test setup.

Docker-marked tests need a Docker engine (`../shared/ci/docker-up.sh` starts one). Where no engine
answers they are skipped, unless `VERO_REQUIRE_DOCKER=1` (set by `.ci/run`): then they fail, so CI
can never pass by skipping them.
"""

from __future__ import annotations

import functools
import os
import subprocess

import pytest

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@functools.cache
def docker_available() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("docker") for item in items) or docker_available():
        return
    if os.environ.get("VERO_REQUIRE_DOCKER") == "1":
        raise pytest.UsageError("VERO_REQUIRE_DOCKER=1 but no Docker engine answers `docker info`")
    skip = pytest.mark.skip(reason="no Docker engine (run ../shared/ci/docker-up.sh)")
    for item in items:
        if item.get_closest_marker("docker"):
            item.add_marker(skip)
