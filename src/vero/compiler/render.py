"""Render the compiled task's text files from the role templates (Jinja2).

Templates live in the top-level `compiler/`, `sidecar/` and `verifier/` asset dirs and are addressed
as `<role>/<file>` (a `PrefixLoader`), so a role template can include a shared one from `compiler/`.
Rendering is deterministic: `StrictUndefined` (a missing value is a bug, not an empty string),
values quoted by the filter of the target language (`toml_str`, `yaml_str`, `sh`), no timestamps
and no host paths in the context.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from functools import cache
from typing import Any

from jinja2 import Environment, FileSystemBytecodeCache, FileSystemLoader, PrefixLoader

from vero._assets import ROLES, asset_dir, template_environment
from vero.core.user_cache import user_cache_dir

__all__ = ["render", "sh_quote", "toml_float", "toml_str", "yaml_str"]


def toml_str(value: str) -> str:
    """A TOML basic string (TOML 1.0 §String: control characters other than tab escaped, DEL too)."""
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_float(value: float) -> str:
    """A TOML float; refuses NaN and infinities (timeouts are finite)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return repr(number)


def yaml_str(value: str) -> str:
    """A YAML double-quoted scalar (a JSON string is one: YAML 1.2 is a superset of JSON)."""
    return json.dumps(str(value), ensure_ascii=True)


def sh_quote(value: str) -> str:
    """A POSIX shell word (`shlex.quote`)."""
    return shlex.quote(str(value))


TEMPLATE_CACHE = "jinja"
"""The per-user cache dir (`vero.core.user_cache`) keeping the compiled templates (Jinja's
`FileSystemBytecodeCache`, by template name and source checksum): compiling the task's dozen
templates costs a build more than rendering them."""


def _bytecode_cache() -> FileSystemBytecodeCache | None:
    """Jinja's bytecode cache in the user's cache dir; None when that cannot be written (Jinja
    would fail the render on a failed write) or is not this user's own (its files are code)."""
    directory = user_cache_dir(os.environ) / TEMPLATE_CACHE
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        owned = directory.stat().st_uid == os.getuid()
    except OSError:
        return None
    if not owned or not os.access(directory, os.W_OK | os.X_OK):
        return None
    return FileSystemBytecodeCache(str(directory))


@cache
def _environment() -> Environment:
    loader = PrefixLoader({role: FileSystemLoader(str(asset_dir(role))) for role in ROLES})
    env = template_environment(loader, autoescape=False)
    env.bytecode_cache = _bytecode_cache()
    env.filters.update(toml_str=toml_str, toml_float=toml_float, yaml_str=yaml_str, sh=sh_quote)
    return env


def render(template: str, **context: Any) -> str:
    """Render `<role>/<file>` with `context`.

    Raises:
        FileNotFoundError: a role's asset directory is missing (a broken installation).
        jinja2.TemplateNotFound: no such template among the role assets.
        jinja2.UndefinedError: the template uses a value the context lacks.
    """
    return _environment().get_template(template).render(**context)
