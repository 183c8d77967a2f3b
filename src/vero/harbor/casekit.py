"""The case kit (`vero-kit`): where its source is, where its static binary comes from, where it goes.

`casekit/vero-kit.c` (shipped in the wheel as the `casekit` asset) is one self-contained C program.
Built with `cc -static`, it runs in any Linux case image of the host's architecture (Debian,
Ubuntu, Alpine, images without Python, setpriv or sudo): it needs only the kernel and /proc. The
install agent uploads it into every case container of a `kind: program` target at
`KIT_PATH_IN_CASE`; the case's tests call it (docs/cases.md "Writing program cases").

Where the binary comes from, first match wins (`kit_binary`):

1. `$VERO_CASE_KIT`, a path to a built kit;
2. `/opt/vero/kit/vero-kit`, built into the compiled sidecar and verifier images
   (`sidecar/Dockerfile.j2`, `verifier/Dockerfile.j2`);
3. a build from the packaged source with the local C compiler (`cc`, or `$CC`), cached per user
   under `$XDG_CACHE_HOME/vero` (default `~/.cache/vero`) by the source's digest. The cache is
   per user on purpose: a binary another user could have planted is never uploaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from vero._assets import asset_dir
from vero.core.user_cache import user_cache_dir
from vero.errors import InfrastructureFailure

__all__ = [
    "CANDIDATE_USER",
    "KIT_ENV",
    "KIT_IMAGE_PATH",
    "KIT_NAME",
    "KIT_PATH_IN_CASE",
    "build_kit",
    "cached_build",
    "kit_binary",
    "kit_source",
    "mentions_kit",
]

KIT_NAME = "vero-kit"
"""The command case tests call."""

KIT_PATH_IN_CASE = PurePosixPath("/usr/local/bin/vero-kit")
"""Where the install agent puts the kit in each case container (on `PATH` in every common image)."""

KIT_IMAGE_PATH = Path("/opt/vero/kit/vero-kit")
"""Where the compiled sidecar and verifier images build the kit."""

KIT_ENV = "VERO_CASE_KIT"
"""Environment variable naming a built kit (overrides the image path and the local build)."""

CANDIDATE_USER = "vero-candidate"
"""The unprivileged user the kit creates in each case container (`casekit/vero-kit.c`)."""

_BUILD_TIMEOUT_SEC = 120


def kit_source() -> Path:
    """The kit's C source (`casekit/vero-kit.c`, from the installed wheel or the source checkout)."""
    return asset_dir("casekit") / "vero-kit.c"


def build_kit(dest: Path, *, source: Path | None = None, compiler: str | None = None) -> Path:
    """Compile the kit (or another program of `casekit/`, `source`) statically to `dest` (written
    atomically, mode 0755) and return `dest`.

    Raises:
        InfrastructureFailure: no C compiler, or the static build failed (e.g. no static libc:
            on Debian `apt-get install gcc libc6-dev`).
    """
    source = kit_source() if source is None else source
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise InfrastructureFailure(
            f"the case kit is not built and no C compiler is available: install gcc and libc6-dev, or set "
            f"{KIT_ENV} to a static build of {source.name}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vero-kit-", dir=dest.parent) as tmp:
        built = Path(tmp) / KIT_NAME
        try:
            done = subprocess.run(
                [cc, "-static", "-O2", "-o", str(built), str(source)],
                capture_output=True,
                text=True,
                timeout=_BUILD_TIMEOUT_SEC,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InfrastructureFailure(f"the case kit could not be built ({type(exc).__name__})") from None
        if done.returncode != 0:
            raise InfrastructureFailure(
                f"the case kit could not be built with {cc} -static (a static libc is needed: on Debian "
                f"`apt-get install gcc libc6-dev`): {done.stderr.strip()[-500:]}"
            )
        built.chmod(0o755)
        os.replace(built, dest)
    return dest


def kit_binary(env: Mapping[str, str] | None = None) -> Path:
    """The static kit binary to upload into case containers (see the module docstring for the order).

    Raises:
        InfrastructureFailure: `$VERO_CASE_KIT` names no file, or no kit exists and none can be built.
    """
    env = os.environ if env is None else env
    named = env.get(KIT_ENV)
    if named:
        path = Path(named)
        if not path.is_file():
            raise InfrastructureFailure(f"{KIT_ENV} names no file: {named}")
        return path
    if KIT_IMAGE_PATH.is_file():
        return KIT_IMAGE_PATH
    return cached_build(kit_source(), KIT_NAME, env)


def cached_build(source: Path, name: str, env: Mapping[str, str] | None = None) -> Path:
    """A static build of the C program `source` as `name`, from the per-user cache (built on first use).

    The cache key is the source's digest, so an edited source is rebuilt. Used for the kit and for
    `vero harbor check --probe`'s probe (`vero.harbor.probe`).

    Raises:
        InfrastructureFailure: no C compiler, or the static build failed.
    """
    env = os.environ if env is None else env
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    cached = user_cache_dir(env) / f"case-{name.removeprefix('vero-')}-{digest}" / name
    if cached.is_file():
        return cached
    return build_kit(cached, source=source)


def mentions_kit(tests_dir: Path) -> bool:
    """Whether any text file under a case's `tests/` dir names the kit (`vero-kit`).

    The build's check that a case's tests call the kit: a test that never names it cannot use it.
    Files larger than 1 MiB and unreadable files are skipped.
    """
    if not tests_dir.is_dir():
        return False
    needle = KIT_NAME.encode()
    for path in sorted(tests_dir.rglob("*")):
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > 1024 * 1024:
                continue
            if needle in path.read_bytes():
                return True
        except OSError:
            continue
    return False
