"""A `kind: agent` candidate's declared dependencies (`vero.harbor.boundary.dependencies`), without Docker.

Real uv installs from the real package index into a real cache, real candidate hosts (throw-away
uids when root) import the candidate's class with the installed site, and a real `HarborBackend`
turns a failing install into dead attempts before Harbor is ever started.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from _support.cases import reward_script, write_case
from harbor_cases import make_run

from vero.core.run import RunArm
from vero.errors import InfrastructureFailure
from vero.harbor import HarborBackend
from vero.harbor.boundary import CandidateLauncher
from vero.harbor.boundary.dependencies import (
    INSTALL_FAILED_EXCEPTION,
    CandidateSites,
    DependencyInstallError,
    read_declaration,
)
from vero.harbor.boundary.preflight import preflight_in_host
from vero.spec.models import CandidateRuntime, HarborSpec

pytestmark = pytest.mark.timeout(300)

HUMANIZE_AGENT = """
import humanize
from harbor.agents.base import BaseAgent


class Agent(BaseAgent):
    @staticmethod
    def name():
        return "humanized"

    def version(self):
        return humanize.__version__

    async def setup(self, environment):
        pass

    async def run(self, instruction, environment, context):
        pass
"""


def candidate(root: Path, name: str, files: dict[str, str]) -> Path:
    path = root / name
    path.mkdir()
    for file, text in files.items():
        (path / file).write_text(textwrap.dedent(text))
    path.chmod(0o755)
    return path


def test_declarations_are_read_in_order_and_refused_when_malformed(tmp_path):
    assert read_declaration(candidate(tmp_path, "none", {"agent.py": "x = 1\n"})) is None
    empty = candidate(tmp_path, "empty", {"pyproject.toml": '[project]\nname = "a"\ndependencies = []\n'})
    assert read_declaration(empty) is None
    both = candidate(
        tmp_path,
        "both",
        {"pyproject.toml": '[project]\nname = "a"\ndependencies = ["humanize>=4"]\n', "requirements.txt": "rich\n"},
    )
    declaration = read_declaration(both)
    assert declaration is not None
    assert (declaration.source, declaration.requirements) == ("pyproject.toml", ("humanize>=4",))
    tool_only = candidate(tmp_path, "tool-only", {"pyproject.toml": "[tool.x]\n", "requirements.txt": "rich # ui\n"})
    declaration = read_declaration(tool_only)
    assert declaration is not None and declaration.requirements == ("rich",)
    locked = candidate(tmp_path, "locked", {"pyproject.toml": '[project]\nname = "a"\n', "uv.lock": "version = 1\n"})
    declaration = read_declaration(locked)
    assert (
        declaration is not None
        and declaration.source == "uv.lock"
        and set(declaration.files)
        == {
            "pyproject.toml",
            "uv.lock",
        }
    )
    for name, files, said in [
        ("url", {"requirements.txt": "evil @ https://example.invalid/evil.whl\n"}, "URL requirement"),
        ("option", {"requirements.txt": "--index-url https://example.invalid\nrich\n"}, "options"),
        ("bad", {"pyproject.toml": '[project]\nname = "a"\ndependencies = ["not a requirement!"]\n'}, "entry 1"),
        ("toml", {"pyproject.toml": "[project\n"}, "not valid TOML"),
    ]:
        with pytest.raises(DependencyInstallError, match=said):
            read_declaration(candidate(tmp_path, name, files))
    linked = candidate(tmp_path, "linked", {})
    (linked / "requirements.txt").symlink_to("/etc/passwd")
    with pytest.raises(DependencyInstallError, match="link"):
        read_declaration(linked)


def test_a_declared_dependency_is_installed_once_and_imported_by_the_host(
    sites, own_root, jobs_dir, portable_toolchain
):
    """humanize (not in Harbor's closure) is installed as an install uid into a sealed site; the
    host imports the candidate's class with it; the second evaluation of the same declaration
    reuses the site without installing."""
    python = portable_toolchain[1]
    checkout = candidate(
        own_root,
        "humanized",
        {"pyproject.toml": '[project]\nname = "humanized"\ndependencies = ["humanize"]\n', "agent.py": HUMANIZE_AGENT},
    )
    run = make_run(
        candidate_dir=checkout,
        jobs_dir=jobs_dir,
        cases_dir=own_root,
        runtime=CandidateRuntime(kind="agent", agent_import_path="agent:Agent"),
    )

    async def scenario():
        t0 = time.monotonic()
        first = await sites.site_for(checkout, python)
        t1 = time.monotonic()
        second = await sites.site_for(checkout, python)
        t2 = time.monotonic()
        print(f"\ninstall {t1 - t0:.2f} s, cached {t2 - t1:.2f} s ({first.size_bytes} bytes)")
        async with CandidateLauncher(python) as launcher:
            without = await preflight_in_host(launcher, run)
            launcher.site_dir = first.path
            with_site = await preflight_in_host(launcher, run)
        return first, second, without, with_site

    first, second, without, with_site = asyncio.run(scenario())
    assert first is not None and second is not None
    assert not first.reused and first.install_sec > 0 and (first.path / "humanize").is_dir()
    assert second.reused and second.path == first.path and second.install_sec == 0.0
    assert without is not None and without.exception_type == "ModuleNotFoundError"
    assert "humanize" in without.message
    assert with_site is None
    if os.geteuid() == 0:  # sealed: root's, and nobody else may write any of it
        for path in [first.path, *first.path.rglob("*")]:
            info = path.lstat()
            assert info.st_uid == 0 and (stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o022), path
    assert not list(first.path.parent.glob(".staging-*"))


def test_an_installed_package_cannot_shadow_harbor_in_the_host(sites, own_root, jobs_dir, portable_toolchain):
    """The site comes after the interpreter's packages: a site holding a `harbor` that raises leaves
    the host's Harbor (and so its trusted prologue) intact."""
    checkout = candidate(
        own_root,
        "plain",
        {"agent.py": HUMANIZE_AGENT.replace("import humanize\n", "").replace("humanize.__version__", "'1'")},
    )
    site = own_root / "shadow-site"
    (site / "harbor").mkdir(parents=True)
    (site / "harbor" / "__init__.py").write_text("raise RuntimeError('shadowed')\n")
    site.chmod(0o755)
    (site / "harbor").chmod(0o755)
    run = make_run(
        candidate_dir=checkout,
        jobs_dir=jobs_dir,
        cases_dir=own_root,
        runtime=CandidateRuntime(kind="agent", agent_import_path="agent:Agent"),
    )

    async def scenario():
        async with CandidateLauncher(portable_toolchain[1]) as launcher:
            launcher.site_dir = site
            return await preflight_in_host(launcher, run)

    assert asyncio.run(scenario()) is None


def test_a_failing_install_is_a_dead_attempt_with_the_installers_error(sites, own_root, jobs_dir, portable_toolchain):
    checkout = candidate(
        own_root,
        "bad-dependency",
        {
            "pyproject.toml": '[project]\nname = "bad"\ndependencies = ["vero-no-such-package-4711==1.0"]\n',
            "agent.py": HUMANIZE_AGENT,
        },
    )
    cases = own_root / "dependency-cases"
    for name in ("c1", "c2"):
        write_case(cases, name, test_sh=reward_script("true"))
    run = make_run(
        evaluation_id="ev-bad-dependency",
        candidate_dir=checkout,
        cases_dir=cases,
        case_names=("c1", "c2"),
        jobs_dir=jobs_dir,
        runtime=CandidateRuntime(kind="agent", agent_import_path="agent:Agent"),
        harbor=HarborSpec(n_attempts=1),
    )
    backend = HarborBackend(python_executable=portable_toolchain[1])
    backend._candidate_sites = sites
    result = asyncio.run(backend.evaluate(run))
    assert result.n_dead == 2 and result.score == 0.0 and result.job_dir is None
    assert {a.exception_type for c in result.cases for a in c.attempts} == {INSTALL_FAILED_EXCEPTION}
    assert result.dependencies is not None and "vero-no-such-package-4711" in (result.dependencies.error or "")
    assert result.diagnostics is not None and result.diagnostics.has_failures
    failures = result.diagnostics.trial_failures
    assert [f.case for f in failures] == ["c1", "c2"]
    assert all("vero-no-such-package-4711" in (f.message or "") for f in failures)
    # What finalization.json's `errors` and the job's causes show: the kind and the installer's words.
    assert any(
        INSTALL_FAILED_EXCEPTION in line and "vero-no-such-package-4711" in line
        for line in result.diagnostics.summary()
    ), result.diagnostics.summary()
    assert not any(p.is_dir() for p in jobs_dir.iterdir())  # Harbor never ran


def test_an_index_that_does_not_answer_is_infrastructure(own_root, anyone_uv, portable_toolchain):
    """A closed port as the index (the operator's `UV_DEFAULT_INDEX`): uv cannot connect, which no
    candidate can cause, so it is an infrastructure failure (refunded), not a dead attempt."""
    parent = Path(tempfile.mkdtemp(prefix="sites-", dir=own_root))
    parent.chmod(0o755)
    sites = CandidateSites(
        parent / "cache", anyone_uv, env={"UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple", "UV_HTTP_RETRIES": "0"}
    )
    checkout = candidate(own_root, "offline", {"requirements.txt": "humanize\n"})
    with pytest.raises(InfrastructureFailure, match="could not be reached"):
        asyncio.run(sites.site_for(checkout, portable_toolchain[1]))
    assert not list((parent / "cache").iterdir())


def test_a_uv_lock_is_installed_as_locked(sites, own_root, anyone_uv, portable_toolchain):
    """With a `uv.lock` beside `pyproject.toml`, the lock's pin is what is installed (an older
    humanize than the newest), not a new resolution of the declared range."""
    checkout = candidate(
        own_root,
        "locked",
        {"pyproject.toml": '[project]\nname = "locked"\nversion = "0"\ndependencies = ["humanize==4.9.0"]\n'},
    )
    lock = [str(anyone_uv), "lock", "--no-config", "--project", str(checkout)]
    subprocess.run(lock, check=True, capture_output=True, timeout=120)
    assert "4.9.0" in (checkout / "uv.lock").read_text()
    # The declared range is widened afterwards: only the lock says 4.9.0 now.
    (checkout / "pyproject.toml").write_text('[project]\nname = "locked"\nversion = "0"\ndependencies = ["humanize"]\n')
    site = asyncio.run(sites.site_for(checkout, portable_toolchain[1]))
    assert site is not None and site.source == "uv.lock"
    assert [p.name for p in site.path.glob("humanize-*.dist-info")] == ["humanize-4.9.0.dist-info"]


def test_each_arm_of_a_paired_run_installs_its_own_declaration(sites, own_root, jobs_dir, portable_toolchain):
    """A paired run (the verifier's target beside its baseline): each arm's checkout is installed
    for its own hosts, and an arm whose install fails gets its own dead attempts, with its own
    installer's error labelled by its arm. Both fail here, so Harbor never starts."""
    arms = {}
    for label in ("candidate", "baseline"):
        arms[label] = candidate(
            own_root,
            f"paired-{label}",
            {
                "requirements.txt": f"vero-no-such-{label}-4711==1.0\n",
                "agent.py": HUMANIZE_AGENT,
            },
        )
    cases = own_root / "paired-dependency-cases"
    write_case(cases, "c1", test_sh=reward_script("true"))
    run = make_run(
        evaluation_id="ev-paired-dependency",
        candidate_dir=arms["candidate"],
        cases_dir=cases,
        case_names=("c1",),
        jobs_dir=jobs_dir,
        runtime=CandidateRuntime(kind="agent", agent_import_path="agent:Agent"),
        harbor=HarborSpec(n_attempts=1),
    )
    backend = HarborBackend(python_executable=portable_toolchain[1])
    backend._candidate_sites = sites
    paired = asyncio.run(backend.evaluate_paired(run, RunArm(candidate="b" * 40, candidate_dir=arms["baseline"])))
    for label, result in (("candidate", paired.candidate), ("baseline", paired.baseline)):
        other = "baseline" if label == "candidate" else "candidate"
        assert result.n_dead == 1 and result.job_dir is None, (label, result)
        assert result.dependencies is not None and result.dependencies.key is None  # nothing cached
        assert f"vero-no-such-{label}-4711" in (result.dependencies.error or "")
        assert f"vero-no-such-{other}-4711" not in (result.dependencies.error or "")
        assert result.diagnostics is not None
        failures = result.diagnostics.trial_failures
        assert [(f.case, f.arm, f.exception_type) for f in failures] == [("c1", label, INSTALL_FAILED_EXCEPTION)]
        assert f"vero-no-such-{label}-4711" in (failures[0].message or "")
        # finalization.json's `errors` line for the arm names it, the kind and the installer's words.
        assert any(
            line.startswith(f"{label} arm: 1 trial(s) dead ({INSTALL_FAILED_EXCEPTION})")
            and f"vero-no-such-{label}-4711" in line
            for line in result.diagnostics.summary()
        ), result.diagnostics.summary()
    assert not any(p.is_dir() for p in jobs_dir.iterdir())  # Harbor never ran


@pytest.mark.skipif(os.geteuid() != 0, reason="installs run as an install uid only when root")
def test_an_interpreter_the_install_uid_cannot_run_is_infrastructure(sites, own_root, portable_toolchain):
    """The hosts' interpreter behind a directory only root may enter: uv, as the install uid, could
    not inspect it, which is the trusted side's fault (an image or machine misconfigured), never the
    candidate's dead attempt; nothing is cached."""
    closed = Path(tempfile.mkdtemp(prefix="root-only-", dir=own_root))
    closed.chmod(0o700)
    python = closed / "python"
    python.symlink_to(portable_toolchain[1])
    checkout = candidate(own_root, "fine-declaration", {"requirements.txt": "humanize\n"})
    with pytest.raises(InfrastructureFailure, match="cannot run as an install uid"):
        asyncio.run(sites.site_for(checkout, python))
    assert not [p for p in sites.root.iterdir() if not p.name.startswith(".")]
    assert not list(sites.root.glob(".staging-*"))
