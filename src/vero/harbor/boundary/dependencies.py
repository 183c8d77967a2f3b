"""A `kind: agent` candidate's declared dependencies: read from its checkout, installed once per
declaration into a cached site dir that its candidate hosts add to `sys.path` (docs/cases.md,
"Dependencies of agent targets").

Where they are declared (the first that applies, in the checkout's top directory):

1. `pyproject.toml` with a `[project]` table and a `uv.lock` beside it: the lock's pinned packages
   (`uv export --frozen`, never a new resolution), the project itself left out;
2. `pyproject.toml` with PEP 621 `project.dependencies`;
3. `requirements.txt`: one PEP 508 requirement per line (`#` comments; no options such as `-e`,
   `-r` or `--index-url`).

No declaration, or an empty one: no install, the candidate runs on the trusted interpreter's
packages as before. Requirements with a URL (`name @ https://...`) are refused: packages come from
the package index (or `UV_INDEX_URL`/`UV_DEFAULT_INDEX` of the trusted process) only.

How (`CandidateSites.site_for`), in the trusted process that measures the candidate:

- the declaration's files are read without following a link (`O_NOFOLLOW`), at most 1 MiB each;
- the **key** is the SHA-256 of the declaration (requirements or lock bytes), the host interpreter's
  version and path, the installed distributions of that interpreter (the constraints below) and
  the installer's version: the same declaration on the same image finds the same site;
- a site that exists under its key is used as it is (no install: `SiteInstall.reused`);
- else **uv** installs it into a fresh staging dir, as an **install uid** (`INSTALL_UID_RANGE`, not
  a candidate host's uid, never root) that owns nothing else: `uv pip install --target`, wheels
  only (`--no-build`: no build backend or `setup.py` of any package runs, so no code the candidate
  chose runs at install time), no configuration file read (`--no-config`), no interpreter
  download, constrained to the interpreter's own distributions (`-c`: Harbor and its closure stay
  the versions the image pins; a declaration that asks for another version of one of them fails to
  resolve), bounded by `install_timeout_sec` (the process group is killed) and `max_install_bytes`
  (measured after); its download cache lives in the staging dir and goes with it;
- the staging dir is then given to root and made read-only to everyone else (`lchown`, write bits
  removed, links never followed), and renamed to its key: a later candidate's host (another uid)
  can read it, not change it, and a partial or failed install never sits under a key.

A failure (uv's exit status, a timeout, the size bound, a malformed declaration) raises
`DependencyInstallError` carrying the installer's error: the candidate's dead attempt, not an
infrastructure failure. A missing installer, an unusable cache root, a hosts' interpreter the
install uid cannot run (checked by running it as that uid before uv, not read from uv's error, which
a declaration could imitate), or an index that does not answer (uv's connection errors: the
candidate cannot name another host) raises `InfrastructureFailure`.

Candidate hosts run the trusted interpreter (`python -I`) and add the site with `site.addsitedir`
only after their trusted prologue (`vero.harbor.boundary.host`): Harbor and vero are imported from
the interpreter's own packages, which come first on `sys.path`, so no installed package can shadow
them; the site's `.pth` files run as the candidate's own code.

Network: an install needs the index; its uids are outside `CANDIDATE_UID_RANGE`, so the candidate
hosts' network fence (`vero.harbor.boundary.fence`: `meta skuid` on that range) leaves installs the
index, while no candidate code runs as an install uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from vero.core.storage import remove_tree
from vero.errors import InfrastructureFailure
from vero.harbor.boundary.launcher import uid_in_use

__all__ = [
    "INSTALL_UID_RANGE",
    "CandidateSites",
    "Declaration",
    "DependencyInstallError",
    "SiteInstall",
    "find_uv",
    "read_declaration",
]

logger = logging.getLogger("vero.harbor.boundary")

INSTALL_UID_RANGE = range(60000, 61000)
"""uids (and equal gids) of dependency installs: beside `CANDIDATE_UID_RANGE` (52000-59999), not in
it, so that confining candidate hosts' network by uid leaves installs the package index."""

INSTALL_FAILED_EXCEPTION = "DependencyInstallError"
"""Exception type of the dead attempts of a candidate whose dependencies could not be installed."""

_INTERPRETER_CHECK_SEC = 60.0
"""How long the hosts' interpreter may take to start as an install uid (`_check_interpreter`)."""
_UNREACHABLE = re.compile(
    r"error sending request|dns error|failed to lookup address|connection refused|network is unreachable"
    r"|tcp connect error|connection reset|certificate verify failed",
    re.I,
)
"""uv's words when the index did not answer (no URL requirement is allowed, so only the index's
host is ever contacted): an infrastructure failure, refunded, never the candidate's dead attempt."""

_MAX_DECLARATION_BYTES = 1 << 20
_MAX_ERROR_CHARS = 4000
_FREEZE = (
    "import importlib.metadata as m, json, sys\n"
    "names = {}\n"
    "for d in m.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name and name.lower() not in names:\n"
    "        names[name.lower()] = f'{name}=={d.version}'\n"
    "print(json.dumps({'version': sys.version, 'pins': sorted(names.values())}))\n"
)


class DependencyInstallError(Exception):
    """The candidate's dependencies could not be installed: its dead attempt.

    Attributes:
        message: what the installer (or the declaration check) said, clipped to 4000 characters;
            candidate-influenced text for the operator's diagnostics.
        install_sec: how long the failed install ran (0 for a declaration refused before it).
    """

    def __init__(self, message: str, install_sec: float = 0.0) -> None:
        super().__init__(message)
        self.message = message[-_MAX_ERROR_CHARS:]
        self.install_sec = install_sec


@dataclass(frozen=True)
class Declaration:
    """What a checkout declares (see the module docstring for the order).

    Attributes:
        source: `uv.lock`, `pyproject.toml` or `requirements.txt`.
        requirements: the PEP 508 requirements (empty for `uv.lock`: the lock is exported at install).
        files: file name -> bytes of the files the declaration is made of (the key hashes them).
    """

    source: str
    requirements: tuple[str, ...]
    files: Mapping[str, bytes]

    def digest(self) -> str:
        """SHA-256 (hex) of the declaration's source, requirements and files."""
        h = hashlib.sha256(self.source.encode())
        for requirement in self.requirements:
            h.update(b"\0r" + requirement.encode())
        for name in sorted(self.files):
            h.update(b"\0f" + name.encode() + b"\0" + hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()


@dataclass(frozen=True)
class SiteInstall:
    """The candidate's site dir, as `CandidateSites.site_for` found or made it.

    Attributes:
        source: the declaration's file (`uv.lock`, `pyproject.toml`, `requirements.txt`).
        key: the cache key (hex), also the site dir's name.
        path: the site dir (add it with `site.addsitedir`).
        reused: True when it existed already (nothing was installed).
        install_sec: wall time of this call's install (0.0 when reused), seconds.
        size_bytes: bytes of the site's regular files.
        python_version: the host interpreter's `sys.version` (first word).
    """

    source: str
    key: str
    path: Path
    reused: bool
    install_sec: float
    size_bytes: int
    python_version: str


def _read_top_file(checkout: Path, name: str) -> bytes | None:
    """The bytes of regular file `name` in the checkout's top dir, never through a link; None if absent."""
    try:
        fd = os.open(checkout / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DependencyInstallError(f"{name}: cannot be read ({exc.strerror}; a link is refused)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DependencyInstallError(f"{name}: not a regular file")
        data = os.read(fd, _MAX_DECLARATION_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_DECLARATION_BYTES:
        raise DependencyInstallError(f"{name}: larger than {_MAX_DECLARATION_BYTES} bytes")
    return data


def _checked(requirements: list[object], where: str) -> tuple[str, ...]:
    kept = []
    for number, text in enumerate(requirements, 1):
        if not isinstance(text, str):
            raise DependencyInstallError(f"{where} entry {number}: expected a string")
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise DependencyInstallError(f"{where} entry {number}: {exc}") from None
        if requirement.url:
            raise DependencyInstallError(
                f"{where} entry {number} ({requirement.name}): a URL requirement is refused; "
                "packages come from the package index"
            )
        kept.append(str(requirement))
    return tuple(kept)


def _requirements_lines(data: bytes) -> list[object]:
    lines: list[object] = []
    for number, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise DependencyInstallError(f"requirements.txt line {number}: options ({line.split()[0]}) are refused")
        lines.append(line)
    return lines


def read_declaration(checkout: Path) -> Declaration | None:
    """The dependencies `checkout` declares, or None when it declares none (or an empty list).

    Raises:
        DependencyInstallError: a declaration file is a link, not a regular file, too large, not
            valid TOML, or holds a malformed, URL or option requirement (the candidate's fault).
    """
    pyproject = _read_top_file(checkout, "pyproject.toml")
    if pyproject is not None:
        try:
            document = tomllib.loads(pyproject.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise DependencyInstallError(f"pyproject.toml: not valid TOML ({exc})") from None
        project = document.get("project")
        if isinstance(project, dict):
            lock = _read_top_file(checkout, "uv.lock")
            if lock is not None:
                return Declaration("uv.lock", (), {"pyproject.toml": pyproject, "uv.lock": lock})
            dependencies = project.get("dependencies", [])
            if not isinstance(dependencies, list):
                raise DependencyInstallError("pyproject.toml: project.dependencies must be a list of strings")
            requirements = _checked(dependencies, "pyproject.toml project.dependencies")
            return Declaration("pyproject.toml", requirements, {}) if requirements else None
    data = _read_top_file(checkout, "requirements.txt")
    if data is None:
        return None
    requirements = _checked(_requirements_lines(data), "requirements.txt")
    return Declaration("requirements.txt", requirements, {}) if requirements else None


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
    return total


def _seal_tree(root: Path) -> None:
    """Give `root` and everything below it to root, without write bits for group and others
    (directories and files readable by all; never following a link)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for path in [dirpath, *(os.path.join(dirpath, entry) for entry in [*dirnames, *filenames])]:
            info = os.lstat(path)
            if os.geteuid() == 0:
                os.lchown(path, 0, 0)
            if stat.S_ISLNK(info.st_mode):
                continue
            mode = stat.S_IMODE(info.st_mode) & ~0o7022 | 0o444
            if stat.S_ISDIR(info.st_mode) or mode & 0o100:
                mode |= 0o555
            os.chmod(path, mode)


class CandidateSites:
    """The cache of candidates' site dirs under `root` (one per key; see the module docstring).

    Args:
        root: the cache dir; created 0755, and refused (`InfrastructureFailure`) when it is a link,
            not this process's, or writable by others.
        uv: the installer (`uv`), run as the install uid; None where there is none (a declaration
            then fails as infrastructure, a checkout without one needs none).
        env: variables passed to the installer besides its fixed ones (the index settings).
        isolate: install as an install uid (default: when this process is root); off where the
            candidate hosts run as this process too (`vero harbor check`).
    """

    def __init__(
        self, root: Path, uv: Path | None, *, env: Mapping[str, str] | None = None, isolate: bool | None = None
    ) -> None:
        self.root = Path(root)
        self.uv = uv
        self.env = dict(env or {})
        self.isolate = os.geteuid() == 0 if isolate is None else isolate
        self._interpreters: dict[Path, tuple[str, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _open_root(self) -> None:
        try:
            self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            info = os.lstat(self.root)
        except OSError as exc:
            raise InfrastructureFailure(f"the candidate site cache cannot be made ({exc.strerror})") from None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise InfrastructureFailure(
                "the candidate site cache is a link, not this process's, or writable by others: refused"
            )

    def _interpreter(self, python: Path) -> tuple[str, str]:
        """`(sys.version, constraints text)` of the trusted interpreter `python` (cached)."""
        if python not in self._interpreters:
            try:
                out = subprocess.run(
                    [str(python), "-I", "-c", _FREEZE], capture_output=True, check=True, timeout=60, cwd="/"
                ).stdout
                answer = json.loads(out)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                raise InfrastructureFailure(
                    f"the candidate hosts' interpreter cannot list its packages ({type(exc).__name__})"
                ) from None
            pins = [p for p in answer["pins"] if not p.lower().startswith("vero==")]
            self._interpreters[python] = (str(answer["version"]).split()[0], "".join(f"{p}\n" for p in pins))
        return self._interpreters[python]

    def _uv_version(self) -> str:
        if self.uv is None:
            raise InfrastructureFailure("the dependency installer (uv) is not installed here")
        try:
            return subprocess.run(
                [str(self.uv), "--version"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise InfrastructureFailure(f"the dependency installer cannot run ({type(exc).__name__})") from None

    def python_version(self, python: Path) -> str:
        """`X.Y.Z` of the trusted interpreter `python`.

        Raises:
            InfrastructureFailure: it cannot run.
        """
        return self._interpreter(python)[0]

    async def site_for(
        self, checkout: Path, python: Path, *, timeout_sec: float = 600.0, max_bytes: int = 2 << 30
    ) -> SiteInstall | None:
        """The site dir of the dependencies `checkout` declares, for hosts run by `python`, installed
        within `timeout_sec` seconds and `max_bytes` bytes.

        Returns:
            None when the checkout declares no dependencies; else the site (made now or reused).

        Raises:
            DependencyInstallError: the declaration is malformed or the install failed (the
                candidate's: its dead attempts carry `message`).
            InfrastructureFailure: the cache root is unusable, the installer or the interpreter
                cannot run.
        """
        declaration = await asyncio.to_thread(read_declaration, checkout)
        if declaration is None:
            return None
        await asyncio.to_thread(self._open_root)
        version, constraints = await asyncio.to_thread(self._interpreter, python)
        uv_version = await asyncio.to_thread(self._uv_version)
        key_material = json.dumps(
            {
                "declaration": declaration.digest(),
                "python": [version, str(python)],
                "constraints": hashlib.sha256(constraints.encode()).hexdigest(),
                "installer": uv_version,
                "index": sorted(self.env.items()),
            },
            sort_keys=True,
        )
        key = hashlib.sha256(key_material.encode()).hexdigest()[:32]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            site = self.root / key
            if site.is_dir() and not site.is_symlink():
                size = await asyncio.to_thread(_tree_bytes, site)
                return SiteInstall(declaration.source, key, site, True, 0.0, size, version)
            started = time.monotonic()
            staging = await self._install(declaration, python, constraints, timeout_sec)
            install_sec = time.monotonic() - started
            try:
                size = await asyncio.to_thread(_tree_bytes, staging / "site")
                if size > max_bytes:
                    raise DependencyInstallError(
                        f"the installed dependencies take {size} bytes, over the bound of {max_bytes} bytes",
                        install_sec,
                    )
                await asyncio.to_thread(_seal_tree, staging / "site")
                try:
                    await asyncio.to_thread(os.rename, staging / "site", site)
                except OSError:
                    if not site.is_dir():  # else another process installed the same key meanwhile
                        raise
            finally:
                await asyncio.to_thread(remove_tree, staging)
            logger.info(
                "candidate dependencies (%s) installed in %.1f s, %d bytes", declaration.source, install_sec, size
            )
            return SiteInstall(declaration.source, key, site, False, install_sec, size, version)

    async def _install(self, declaration: Declaration, python: Path, constraints: str, timeout_sec: float) -> Path:
        """Install into `<root>/.staging-<hex>/site` as an install uid; returns the staging dir."""
        staging = self.root / f".staging-{secrets.token_hex(8)}"
        staging.mkdir(mode=0o700)
        try:
            uid = await asyncio.to_thread(_free_install_uid) if self.isolate else None
            for name in ("home", "tmp", "cache"):
                (staging / name).mkdir(mode=0o700)
            (staging / "constraints.txt").write_text(constraints)
            (staging / "requirements.txt").write_text("".join(f"{r}\n" for r in declaration.requirements))
            for name, data in declaration.files.items():
                (staging / "project").mkdir(mode=0o700, exist_ok=True)
                (staging / "project" / name).write_bytes(data)
            if uid is not None:
                for dirpath, dirnames, filenames in os.walk(staging):
                    os.lchown(dirpath, uid, uid)
                    for entry in [*dirnames, *filenames]:
                        os.lchown(os.path.join(dirpath, entry), uid, uid)
            if uid is not None:
                await _check_interpreter(python, uid)
            deadline = (time.monotonic() + timeout_sec, timeout_sec)
            if declaration.source == "uv.lock":
                await self._run(
                    [
                        "export",
                        "--frozen",
                        "--no-emit-project",
                        "--no-emit-workspace",
                        "--no-hashes",
                        "--no-header",
                        "--no-annotate",
                        "--format",
                        "requirements-txt",
                        "--project",
                        str(staging / "project"),
                        "--output-file",
                        str(staging / "requirements.txt"),
                    ],
                    staging,
                    uid,
                    deadline,
                )
                exported = _read_top_file(staging, "requirements.txt") or b""
                _checked(_requirements_lines(exported), "uv.lock (exported)")
            await self._run(
                [
                    "pip",
                    "install",
                    "--no-build",
                    "--python",
                    str(python),
                    "--target",
                    str(staging / "site"),
                    "--constraint",
                    str(staging / "constraints.txt"),
                    "--requirement",
                    str(staging / "requirements.txt"),
                ],
                staging,
                uid,
                deadline,
            )
        except BaseException:
            await asyncio.to_thread(remove_tree, staging)
            raise
        return staging

    async def _run(self, arguments: list[str], staging: Path, uid: int | None, deadline: tuple[float, float]) -> None:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(staging / "home"),
            "TMPDIR": str(staging / "tmp"),
            "UV_CACHE_DIR": str(staging / "cache"),
            "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "NO_COLOR": "1",
            **{k: v for k, v in os.environ.items() if k in ("SSL_CERT_FILE", "SSL_CERT_DIR")},
            **self.env,
        }
        identity = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        process = await asyncio.create_subprocess_exec(
            str(self.uv),
            *arguments,
            "--no-config",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(staging),
            env=env,
            start_new_session=True,
            **identity,  # type: ignore[arg-type]
        )
        started = time.monotonic()
        try:
            output, _ = await asyncio.wait_for(process.communicate(), max(0.1, deadline[0] - time.monotonic()))
        except TimeoutError:
            raise DependencyInstallError(
                f"the dependency install took longer than its bound ({deadline[1]:g} s)",
                time.monotonic() - started,
            ) from None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.returncode is None:
                await process.wait()
        if process.returncode != 0:
            text = output.decode(errors="replace").strip()
            if _UNREACHABLE.search(text):
                # The index itself did not answer: not the candidate's (it cannot name another host).
                raise InfrastructureFailure(f"the package index could not be reached: {text[-500:]}")
            raise DependencyInstallError(f"uv {arguments[0]} failed: {text}", time.monotonic() - started)


async def _check_interpreter(python: Path, uid: int) -> None:
    """The install uid can run the hosts' interpreter (uv inspects it as that uid).

    Raises:
        InfrastructureFailure: it cannot (an image or machine whose interpreter other uids may not
            run): the trusted side's fault, so never the candidate's dead attempt. Checked apart from
            uv, whose error text a candidate's declaration could imitate.
    """
    try:
        process = await asyncio.create_subprocess_exec(
            str(python),
            "-I",
            "-c",
            "",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            user=uid,
            group=uid,
            extra_groups=[],
            start_new_session=True,
        )
        _, error = await asyncio.wait_for(process.communicate(), _INTERPRETER_CHECK_SEC)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        raise InfrastructureFailure(
            f"{python} did not start as an install uid within {_INTERPRETER_CHECK_SEC:g} s"
        ) from None
    except OSError as exc:
        raise InfrastructureFailure(f"{python} cannot run as an install uid ({uid}): {exc}") from None
    if process.returncode != 0:
        said = error.decode(errors="replace").strip()[-500:]
        raise InfrastructureFailure(f"{python} cannot run as an install uid ({uid}): exit {process.returncode}: {said}")


def _free_install_uid() -> int:
    for _ in range(64):
        uid = INSTALL_UID_RANGE.start + secrets.randbelow(len(INSTALL_UID_RANGE))
        if not uid_in_use(uid):
            return uid
    raise InfrastructureFailure("no free uid for a dependency install")


def find_uv(near: Path) -> Path | None:
    """The installer: `uv` beside the trusted interpreter (the images' `/opt/vero/venv/bin/uv`), else
    the uv running this process (`$UV`, set by `uv run`: the binary, where `PATH` may hold a shim),
    else on `PATH`."""
    for candidate in (near.parent / "uv", Path(os.environ.get("UV") or "/nonexistent")):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("uv")
    return Path(found) if found else None
