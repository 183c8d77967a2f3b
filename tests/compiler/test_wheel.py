"""The vero wheel the compiler ships: byte-reproducible, well-formed, installable with pip."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import zipfile
from io import BytesIO

import pytest

from vero.compiler.wheel import CLIENT_PACKAGES, build_wheel, client_requirements, runtime_requirements

pytestmark = pytest.mark.timeout(300)


def test_wheel_bytes_are_reproducible_and_entries_canonical():
    first, second = build_wheel(), build_wheel()
    assert first.data == second.data
    assert first.filename == "vero-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(BytesIO(first.data)) as archive:
        infos = archive.infolist()
        names = [i.filename for i in infos]
        assert names[-1] == "vero-0.1.0.dist-info/RECORD"
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        assert {(i.external_attr >> 16) & 0o777 for i in infos} <= {0o644, 0o755}
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        assert "vero/compiler/build.py" in names
        assert "vero/_assets/compiler/task.toml.j2" in names
        assert "vero/_assets/sidecar/Dockerfile.j2" in names
        # RECORD lists every other entry with its PEP 376 hash and size.
        record = archive.read("vero-0.1.0.dist-info/RECORD").decode().splitlines()
        listed = {}
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            listed[path] = (digest, size)
        assert set(listed) == set(names)
        for name in names[:-1]:
            data = archive.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert listed[name] == (expected, str(len(data))), name
        entry_points = archive.read("vero-0.1.0.dist-info/entry_points.txt").decode()
        assert "vero = vero._entry:main" in entry_points
        # Nested runs' entry in the sidecar's and the verifier's images (vero.harbor.nested_cli).
        assert "vero-harbor-run = vero.harbor.nested_cli:main" in entry_points
        metadata = archive.read("vero-0.1.0.dist-info/METADATA").decode()
        assert "Name: vero\n" in metadata and "Requires-Dist: harbor==0.26.0\n" in metadata


def test_pins_are_exact_and_follow_the_spec_harbor():
    client = client_requirements()
    assert [r.split("==")[0] for r in client] == sorted(CLIENT_PACKAGES)
    assert all("==" in r for r in client)
    runtime = runtime_requirements("harbor[modal]==0.26.0")
    assert "harbor[modal]==0.26.0" in runtime
    assert not any(r.startswith("harbor==") for r in runtime)
    assert all("==" in r for r in runtime)
    assert {r.split("==")[0].lower() for r in runtime} >= {"fastapi", "uvicorn", "httpx", "gitpython", "pydantic"}


def test_pip_installs_the_wheel_and_the_installed_vero_rebuilds_the_same_wheel(tmp_path):
    wheel = build_wheel()
    path = tmp_path / wheel.filename
    path.write_bytes(wheel.data)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pip.returncode == 0, pip.stderr
    assert (venv / "bin" / "vero").is_file()
    # Run the installed copy (dependencies borrowed from this environment, after the venv's own vero).
    deps = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": deps, "HARBOR_TELEMETRY": "0"}
    probe = (
        "import vero, vero._assets as a, sys; from vero.compiler.wheel import build_wheel;"
        "print(vero.__file__); print(a.asset_dir('compiler')); sys.stdout.flush();"
        "sys.stdout.buffer.write(build_wheel().data)"
    )
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    first, second, rebuilt = done.stdout.split(b"\n", 2)
    site = str(venv)
    assert first.decode().startswith(site) and second.decode().startswith(site)
    assert second.decode().endswith("vero/_assets/compiler")
    assert rebuilt == wheel.data
    help_text = subprocess.run(
        [str(venv / "bin" / "vero"), "harbor", "build", "--help"], env=env, capture_output=True, text=True, timeout=120
    )
    assert help_text.returncode == 0 and "--tarball" in help_text.stdout
