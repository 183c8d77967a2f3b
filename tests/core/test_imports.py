"""The layering of `src/vero` (docs/architecture.md, "Layout"), checked on the source and in a fresh interpreter.

- `vero.core` is the trusted core: no web framework, HTTP client, CLI toolkit or Harbor, neither
  imported by a core module (at any depth of its body) nor pulled in when a core module loads;
- only `vero.harbor` (vero's adapter to Harbor) and the compiler's task check import Harbor;
- every third-party package `src/vero` imports is declared in `pyproject.toml`, not only pulled in by another;
- no module of `src/vero` takes part in an import cycle when it loads;
- no package imports another package's private (`_`-prefixed) module: what a package offers the
  others is in its public modules (`vero.core.isolated_git`, not a `vero.core._git`);
- no module compares an environment's name with a kind's (`== "docker"`, `in ("modal", ...)`,
  `case "docker":`) outside the environment modules (`vero.spec.environments`, what vero supports
  per kind, and `vero.harbor.environments`, what it does there): what differs per kind is asked
  of the kind.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SRC = Path(__file__).resolve().parents[2] / "src"
FORBIDDEN = ("fastapi", "httpx", "typer", "harbor", "starlette", "uvicorn")
CORE_MODULES = (
    "vero.core",
    "vero.core.policy",
    "vero.core.ledger",
    "vero.core.jobs",
    "vero.core.storage",
    "vero.core.evaluation",
    "vero.core.archive",
    "vero.core.candidates",
    "vero.core.session",
    "vero.core.baseline",
)
# Outside `vero.harbor`, these modules check compiled files against Harbor's own models.
HARBOR_TASK_CHECK = {"vero.compiler.build", "vero.compiler.case_audit"}


def _module_names() -> dict[str, Path]:
    modules = {}
    for path in (SRC / "vero").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _module_names()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, *, import_time_only: bool) -> Iterator[tuple[str, int]]:
    """(imported module, line) of each import statement in `module`, `TYPE_CHECKING` blocks left out.

    `import_time_only` leaves out imports inside functions (they run on a call, not when the module loads).
    A `from package import name` also yields `package.name` when that is a module.
    """
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> Iterator[tuple[str, int]]:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                yield from visit(node.orelse)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not import_time_only:
                    yield from visit(node.body)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                yield target, node.lineno
                for alias in node.names:
                    if f"{target}.{alias.name}" in MODULES:
                        yield f"{target}.{alias.name}", node.lineno
            else:  # if/try/with/for/class bodies run when the module loads
                children = list(ast.iter_child_nodes(node))
                handlers = [h.body for h in children if isinstance(h, ast.ExceptHandler)]
                yield from visit([n for n in children if isinstance(n, ast.stmt)] + [s for b in handlers for s in b])

    yield from visit(ast.parse(path.read_text(encoding="utf-8")).body)


def _top(name: str) -> str:
    return name.split(".")[0]


def _loaded_with(module: str) -> set[str]:
    """Every vero module that loading `module` loads (its packages' `__init__`s included)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for n in [".".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            if n in MODULES and n not in seen:
                seen.add(n)
                todo.extend(t for t, _ in _imports(n, import_time_only=True) if t in MODULES)
    return seen


def test_the_source_scan_sees_the_imports_it_judges():
    # The rules below are only as good as the scan: it must find lazy, relative and package imports.
    lazy = dict(_imports("vero.spec.cases", import_time_only=False))
    assert "vero.harbor.catalog" in lazy and "vero.harbor.catalog" not in dict(
        _imports("vero.spec.cases", import_time_only=True)
    )
    assert {"vero.errors", "vero.core", "vero.spec"} <= _loaded_with("vero.core.jobs")
    assert "harbor" in {_top(t) for t, _ in _imports("vero.harbor.catalog", import_time_only=False)}


def test_core_modules_import_no_web_cli_or_harbor_code():
    found = []
    for module in (m for m in MODULES if m == "vero.core" or m.startswith("vero.core.")):
        found += [
            f"{module}:{line} imports {target}"
            for target, line in _imports(module, import_time_only=False)
            if _top(target) in FORBIDDEN
        ]
    for module in (m for m in MODULES if m.startswith("vero.core")):
        found += [
            f"loading {module} loads {other}, which imports {target}"
            for other in sorted(_loaded_with(module))
            for target, _ in _imports(other, import_time_only=True)
            if _top(target) in FORBIDDEN
        ]
    assert found == []


def test_only_the_harbor_adapter_and_the_task_check_import_harbor():
    found = [
        f"{module}:{line} imports {target}"
        for module in MODULES
        if not (module == "vero.harbor" or module.startswith("vero.harbor.")) and module not in HARBOR_TASK_CHECK
        for target, line in _imports(module, import_time_only=False)
        if _top(target) == "harbor"
    ]
    assert found == []


def _private_imports(graph: dict[str, set[str]]) -> list[str]:
    """`module imports target` for each private module `target` (a `_`-prefixed part, not a dunder)
    imported from outside the package that holds it."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            parts = target.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if module != owner and not module.startswith(owner + "."):
                        found.append(f"{module} imports {target}")
                    break
    return found


def test_no_package_imports_another_packages_private_module():
    graph = {m: {t for t, _ in _imports(m, import_time_only=False) if t in MODULES} for m in MODULES}
    # The check itself finds a private import across packages, and allows one inside its package.
    planted = {"vero.compiler.x": {"vero.core._hidden"}, "vero.core.y": {"vero.core._hidden"}}
    assert _private_imports(planted) == ["vero.compiler.x imports vero.core._hidden"]
    assert _private_imports({"vero.verifier": {"vero.verifier._verify"}, "vero.cli": {"vero._entry"}}) == []
    assert _private_imports(graph) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                found.append(sorted([*component, node]))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_module_takes_part_in_an_import_cycle():
    graph = {m: {t for t, _ in _imports(m, import_time_only=True) if t in MODULES and t != m} for m in MODULES}
    # The check itself finds a cycle when there is one.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(graph) == []


def test_every_imported_package_is_declared():
    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    names = {canonicalize_name(Requirement(r).name) for r in declared}
    distributions = importlib.metadata.packages_distributions()
    undeclared = set()
    for module in MODULES:
        for target, line in _imports(module, import_time_only=False):
            top = _top(target)
            if top in sys.stdlib_module_names or top == "vero":
                continue
            # A name no installed distribution provides (an optional extra's module) must be declared by name.
            provided = {canonicalize_name(d) for d in distributions.get(top, [top])}
            if not provided & names:
                undeclared.add(f"{top} ({module}:{line}; from {', '.join(sorted(provided))})")
    assert sorted(undeclared) == []


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


ENVIRONMENT_KINDS = {"docker", "modal"}
ENVIRONMENT_MODULES = ("vero.spec.environments", "vero.harbor.environments")


def _environment_name_comparisons(tree: ast.AST) -> Iterator[int]:
    """Lines of `tree` that compare something with an environment kind's name."""

    def names_a_kind(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in ENVIRONMENT_KINDS
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names_a_kind(e) for e in node.elts)

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names_a_kind(side) for side in (node.left, *node.comparators)):
            yield node.lineno
        elif isinstance(node, ast.MatchValue) and names_a_kind(node.value):
            yield node.lineno


def _name_comparisons_outside_environment_modules(modules: dict[str, Path]) -> list[str]:
    found = []
    for module, path in sorted(modules.items()):
        if module.startswith(ENVIRONMENT_MODULES):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{module}:{line}" for line in _environment_name_comparisons(tree)]
    return found


def test_no_module_compares_environment_names_outside_the_environment_modules(tmp_path):
    # The check finds each form of the comparison.
    probe = tmp_path / "probe.py"
    probe.write_text(
        'a = env == "docker"\nb = "modal" != env\nc = env in ("docker", "x")\n'
        'match env:\n    case "modal":\n        pass\nd = env == "podman"\ne = ["docker", "info"]\n'
    )
    assert _name_comparisons_outside_environment_modules({"vero.probe": probe}) == [
        "vero.probe:1",
        "vero.probe:2",
        "vero.probe:3",
        "vero.probe:5",
    ]
    assert _name_comparisons_outside_environment_modules(MODULES) == []
