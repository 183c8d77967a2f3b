"""Where a declared secret reaches candidate code: the build's warning per case.

A secret the spec declares (`secrets`) is passed to the nested runs by name, and a case that names
it gets its value where the case puts it: `[environment.env]` and the `main` service's
`environment` of its compose file go into the agent's container (`main`) for every process there;
`[verifier.env]` (a step's too, and a separate verifier environment's own `env`) goes to the
case's tests. Whether candidate code can read it depends on where that code runs
(`vero.compiler.case_audit`):

- `kind: agent`: the candidate's agent runs its commands in `main` as the case's agent user, with
  the container's environment: every secret in `main`'s environment reaches it;
- `kind: program`, a verification in `main` whose tests never call the case kit: the tests run
  candidate code with their own environment (the container's and `[verifier.env]`): every such
  secret reaches it. Through `vero-kit run` candidate code gets a minimal environment (only the
  variables the test passes with `--env`), and the install runs through the kit too;
- `kind: program`, a separate verifier environment: candidate files arrive as artifacts; if the
  tests run them, that code has the verifier's environment.

With network access (Harbor's `network_mode = "public"`, the default) such code can send what it
read anywhere; without, it can still pass it on through what it writes (scrubbing replaces the
value itself in the job dir, not an encoding of it). Provider keys of `inference` never reach a
nested run, so they are never reported. `secret_warnings` says which secret reaches what, per case.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from vero.compiler.case_audit import CaseAudit, audit_case
from vero.errors import SpecError
from vero.spec.models import OptimizationSpec, ProgramTarget

__all__ = ["case_secret_names", "secret_warnings"]

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)|\$([A-Za-z_][A-Za-z0-9_]*)")


def _named(text: str, secrets: set[str]) -> set[str]:
    """The secrets a value template (`${NAME}`, `${NAME:-x}`, `$NAME`) names."""
    return {a or b for a, b in _TEMPLATE.findall(text)} & secrets


def _compose_main_names(case_dir: Path, secrets: set[str]) -> set[str]:
    """Secrets the `main` service of the case's compose file takes into its environment: by a
    template in a value, or as a bare name (Compose passes the host's value on)."""
    path = case_dir / "environment" / "docker-compose.yaml"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return set()
    services = document.get("services") if isinstance(document, dict) else None
    main = services.get("main") if isinstance(services, dict) else None
    environment = main.get("environment") if isinstance(main, dict) else None
    names: set[str] = set()
    items: list[tuple[str, str | None]] = []
    if isinstance(environment, dict):
        items = [(str(k), None if v is None else str(v)) for k, v in environment.items()]
    elif isinstance(environment, list):
        for entry in environment:
            key, sep, text = str(entry).partition("=")
            items.append((key, text if sep else None))
    for key, value in items:
        names |= {key} & secrets if value is None else _named(value, secrets)
    return names


def case_secret_names(case_dir: Path, audit: CaseAudit, secrets: set[str]) -> tuple[set[str], set[str], set[str]]:
    """Which of `secrets` the case at `case_dir` puts where: `(main, tests, separate_tests)`:
    `main`'s environment (`[environment.env]`, the compose file's `main` service), the tests' own
    in `main` (`[verifier.env]`, steps' too), and a separate verifier environment's (the same plus
    `[verifier.environment.env]`, steps' too)."""
    main = {n for value in audit.main_env.values() for n in _named(value, secrets)}
    main |= _compose_main_names(case_dir, secrets)
    tests = {n for v in audit.shared for value in v.env.values() for n in _named(value, secrets)}
    separate = {n for v in audit.separate for value in v.env.values() for n in _named(value, secrets)}
    return main, tests, separate


def _network(mode: str) -> str:
    if mode == "public":
        return "it has network access, so it can send them anywhere"
    return f"network_mode {mode}: it can still pass them on in what it writes"


def _case_warnings(spec: OptimizationSpec, case: str, partition: str, case_dir: Path, secrets: set[str]) -> list[str]:
    audit = audit_case(case_dir)
    main, tests, separate = case_secret_names(case_dir, audit, secrets)
    where = f"case {case!r} (partition {partition})"
    found: list[str] = []
    if not isinstance(spec.target, ProgramTarget):
        if main:
            found.append(
                f"{where}: the secret(s) {', '.join(sorted(main))} are in the environment of its main container, "
                f"where the candidate agent's commands run: candidate code can read them; "
                f"{_network(audit.agent_network_mode)}"
            )
        return found
    if audit.kit_missing:
        names = main | tests
        if names:
            found.append(
                f"{where}: the secret(s) {', '.join(sorted(names))} are in the environment its tests run with, and "
                "its tests never call vero-kit, so candidate code they run can read them; "
                f"{_network(audit.shared[0].network_mode)}"
            )
    if audit.separate and separate:
        found.append(
            f"{where}: the secret(s) {', '.join(sorted(separate))} are in its separate verifier environment, "
            "where candidate files arrive as artifacts: if its tests run them, that code can read them; "
            f"{_network(audit.separate[0].network_mode)}"
        )
    return found


def secret_warnings(
    spec: OptimizationSpec, case_dirs: Mapping[str, Path], partitions: Mapping[str, list[str]]
) -> list[str]:
    """One warning per case and place where a declared secret reaches candidate code (module docstring).

    Args:
        spec: the validated spec (its `secrets`; `inference` provider keys are left out: they reach
            the gateway only).
        case_dirs: case name -> its fetched task dir.
        partitions: partition -> case names, for the cases compiled into the task (or checked).
    """
    provider_keys = (
        {p.api_key_secret for p in spec.inference.providers.values() if p.api_key_secret}
        if spec.inference is not None
        else set()
    )
    secrets = set(spec.effective_secrets()) - provider_keys
    if not secrets:
        return []
    warnings: list[str] = []
    for partition, names in sorted(partitions.items()):
        for case in sorted(names):
            try:
                warnings += _case_warnings(spec, case, partition, case_dirs[case], secrets)
            except (OSError, ValueError, SpecError):
                continue  # not a readable task: the case checks report it
    return warnings
