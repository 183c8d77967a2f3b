"""Find the container-side assets of each role (`compiler/`, `sidecar/`, `verifier/`, `casekit/`).

The assets are Jinja templates, scripts and the case kit's C source, kept at the repository's top
level (docs/architecture.md). A built
wheel carries them at `vero/_assets/<role>` (pyproject's hatch `force-include`); a source checkout or
an editable install (whose `vero` package is `src/vero`) finds them at the repository root instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import jinja2

__all__ = ["ROLES", "Role", "asset_dir", "template_environment"]

Role = Literal["compiler", "sidecar", "verifier", "casekit"]
ROLES: tuple[Role, ...] = ("compiler", "sidecar", "verifier", "casekit")

_PACKAGE_DIR = Path(__file__).resolve().parent


def asset_dir(role: Role) -> Path:
    """The directory holding `role`'s assets.

    Looks in the installed package first (`vero/_assets/<role>`), then at the root of a source
    checkout (`<repo>/<role>`, two levels above `src/vero`).

    Raises:
        ValueError: `role` is not one of `ROLES`.
        FileNotFoundError: neither location exists (a broken installation).
    """
    if role not in ROLES:
        raise ValueError(f"unknown asset role {role!r}; expected one of {', '.join(ROLES)}")
    installed = _PACKAGE_DIR / "_assets" / role
    if installed.is_dir():
        return installed
    checkout = _PACKAGE_DIR.parent.parent / role
    if checkout.is_dir() and (_PACKAGE_DIR.parent.name == "src"):
        return checkout
    raise FileNotFoundError(f"assets of role {role!r} not found at {installed} or {checkout}")


def template_environment(loader: jinja2.BaseLoader, *, autoescape: bool) -> jinja2.Environment:
    """The Jinja environment every vero template renders in.

    An undefined name is an error (`StrictUndefined`), never an empty string; block tags leave no
    blank lines; a template's final newline is kept. `autoescape` is for HTML (the report), never
    for the files a compiled task is made of.
    """
    import jinja2

    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=autoescape,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
