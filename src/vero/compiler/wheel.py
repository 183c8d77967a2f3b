"""A byte-reproducible wheel of the *installed* vero, and the pins the images install beside it.

vero is not on a package index, so each compiled task carries a wheel of the vero that compiled
it (main, sidecar and verifier images install it). The wheel is built here, not by a build backend:
the files of the importable `vero` package (no `__pycache__`, no `.pyc`), the role assets under
`vero/_assets/<role>` (found through `vero._assets`, so a source checkout and an installed wheel
give the same entries), and a `.dist-info` with `METADATA` (the installed distribution's name,
version, summary, `Requires-Python`, `Requires-Dist`, `Provides-Extra`), `WHEEL`,
`entry_points.txt` (the console scripts) and `RECORD` (PEP 376/427 hashes).

Reproducibility: entries sorted (dist-info last, `RECORD` the very last), every timestamp
1980-01-01 00:00:00 (the zip epoch), Unix permissions 0644/0755 only, entries stored uncompressed
so the bytes do not depend on the zlib build. Same installed vero -> same wheel bytes.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

import vero
from vero._assets import ROLES, asset_dir
from vero.compiler.target import walk_tree

__all__ = [
    "CLIENT_PACKAGES",
    "INSTALLER_REQUIREMENT",
    "BuiltWheel",
    "build_wheel",
    "client_requirements",
    "runtime_requirements",
]

DISTRIBUTION = "vero"
CLIENT_PACKAGES = ("httpx", "pydantic", "pyyaml", "rich", "tenacity", "typer")
"""What the agent-side CLI in `main` needs beside the wheel (installed there with `--no-deps`)."""

INSTALLER_REQUIREMENT = "uv==0.13.9"
"""The installer of `kind: agent` candidates' declared dependencies in the sidecar and verifier
images (`vero.harbor.boundary.dependencies`); also makes `target.python`'s interpreter there."""

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class BuiltWheel:
    """A wheel in memory.

    Attributes:
        filename: PEP 427 file name, e.g. `vero-0.1.0-py3-none-any.whl`.
        data: the zip bytes.
    """

    filename: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _package_files() -> list[tuple[str, Path]]:
    """(archive name, file) for the `vero` package and the role assets, sorted by name.

    Bytecode caches are left out (`walk_tree`). An installed wheel holds `vero/_assets`; a checkout
    keeps the assets at the repository root. Either way they are taken from `asset_dir`, so both
    give the same archive names.
    """
    package = Path(vero.__file__).resolve().parent
    trees = [(package, "vero"), *((asset_dir(role), f"vero/_assets/{role}") for role in ROLES)]
    files: dict[str, Path] = {}
    for root, prefix in trees:
        for rel, path, st in walk_tree(root):
            if stat.S_ISDIR(st.st_mode) or (root == package and rel.split("/", 1)[0] == "_assets"):
                continue
            files[f"{prefix}/{rel}"] = path
    return sorted(files.items())


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _metadata(dist: importlib.metadata.Distribution) -> str:
    meta = dist.metadata
    lines = ["Metadata-Version: 2.1", f"Name: {meta['Name']}", f"Version: {meta['Version']}"]
    if meta.get("Summary"):
        lines.append(f"Summary: {meta['Summary']}")
    if meta.get("Requires-Python"):
        lines.append(f"Requires-Python: {meta['Requires-Python']}")
    lines += [f"Requires-Dist: {req}" for req in sorted(meta.get_all("Requires-Dist") or [])]
    lines += [f"Provides-Extra: {extra}" for extra in sorted(meta.get_all("Provides-Extra") or [])]
    return "\n".join(lines) + "\n"


def _entry_points(dist: importlib.metadata.Distribution) -> str:
    scripts = sorted((ep.name, ep.value) for ep in dist.entry_points if ep.group == "console_scripts")
    return "[console_scripts]\n" + "".join(f"{name} = {value}\n" for name, value in scripts)


def _zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # Unix, so external_attr carries the permission bits
    info.external_attr = (0o100000 | mode) << 16
    return info


def build_wheel() -> BuiltWheel:
    """Build the wheel of the installed vero distribution (see the module docstring).

    Raises:
        importlib.metadata.PackageNotFoundError: vero is imported from a tree that is not installed
            (no distribution metadata).
        FileNotFoundError: a role's asset directory is missing (a broken installation); a wheel
            without it would fail only later, inside the images.
    """
    dist = importlib.metadata.distribution(DISTRIBUTION)
    name, version = dist.metadata["Name"], dist.metadata["Version"]
    stem = f"{name.replace('-', '_')}-{version}"
    dist_info = f"{stem}.dist-info"

    entries: list[tuple[str, bytes, int]] = []
    for arcname, path in _package_files():
        mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
        entries.append((arcname, path.read_bytes(), mode))
    entries.append((f"{dist_info}/METADATA", _metadata(dist).encode(), 0o644))
    entries.append(
        (
            f"{dist_info}/WHEEL",
            (b"Wheel-Version: 1.0\nGenerator: vero.compiler.wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
            0o644,
        )
    )
    entries.append((f"{dist_info}/entry_points.txt", _entry_points(dist).encode(), 0o644))
    record = "".join(f"{arc},{_record_hash(data)},{len(data)}\n" for arc, data, _ in entries)
    record += f"{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode(), 0o644))

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for arcname, data, mode in entries:
            archive.writestr(_zip_info(arcname, mode), data)
    return BuiltWheel(f"{stem}-py3-none-any.whl", buffer.getvalue())


def _pin(requirement: Requirement) -> str:
    """`name==<installed version>`; the requirement as declared if it is not installed here."""
    try:
        return f"{requirement.name}=={importlib.metadata.version(requirement.name)}"
    except importlib.metadata.PackageNotFoundError:
        return str(requirement)


def _declared() -> list[Requirement]:
    dist = importlib.metadata.distribution(DISTRIBUTION)
    return [Requirement(r) for r in dist.metadata.get_all("Requires-Dist") or []]


def client_requirements() -> list[str]:
    """Exact pins (the compiler environment's versions) of `CLIENT_PACKAGES`, sorted."""
    return sorted(_pin(Requirement(name)) for name in CLIENT_PACKAGES)


def runtime_requirements(harbor_requirement: str) -> list[str]:
    """Exact pins of vero's unconditional dependencies for the trusted images, sorted.

    Harbor is not taken from vero's metadata but from the spec (`harbor.requirement`, already
    validated as an exact pin), so the nested runs use the Harbor the operator pinned; the installer
    (`INSTALLER_REQUIREMENT`) is pinned beside them.
    """
    pins = [_pin(req) for req in _declared() if req.marker is None and req.name.lower() != "harbor"]
    return sorted([*pins, harbor_requirement.replace(" ", ""), INSTALLER_REQUIREMENT], key=str.lower)
