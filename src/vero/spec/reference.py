"""The spec reference of `docs/spec.md`, generated from the models' field docstrings.

Every field of `OptimizationSpec` (recursively) becomes a row: its YAML path, its type, whether it
is required or its default, and its attribute docstring (read here by pydantic's own reader, the
one `use_attribute_docstrings` applies; the models leave that option off). The rows go
between two markers of the page; the prose around them is written by hand. Regenerate with
`uv run python -m vero.spec.reference docs/spec.md`; `tests/spec/test_reference.py` fails when the
committed page is not what this module renders.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic._internal._docs_extraction import extract_docstrings_from_cls
from pydantic.fields import FieldInfo

from vero.spec.models import AgentTarget, OptimizationSpec, ProgramTarget

__all__ = ["BEGIN", "END", "reference_rows", "render_table", "update_page"]

BEGIN = "<!-- spec-reference:begin -->"
END = "<!-- spec-reference:end -->"

_KEY_NAMES = {
    "agent_access": "<partition>",
    "targets": "<partition>",
    "partitions": "<partition>",
    "partition_files": "<partition>",
    "providers": "<provider>",
    "models": "<model>",
}
"""What a mapping's keys are called in the reference (`agent_access.<partition>.disclosure`)."""


def _type_name(annotation: Any) -> str:
    """A short, YAML-minded name of a field's type (`int`, `maximize` \\| `minimize`, `list of str`)."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(names))
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is tuple:
        return "`[lo, hi]`" if len(args) == 2 else "list"
    if origin is dict:
        return f"map of {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        return "empty"
    value = field.default  # set: a field that is not required and has no factory has a default
    if value is None:
        return "unset"
    if value == "":
        return '`""`'
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 10_000:
        return f"`{value:,}`"
    return f"`{value}`"


@cache
def _docstrings(model: type) -> dict[str, str]:
    return extract_docstrings_from_cls(model, use_inspect=True)


def _field_doc(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    """The field's `description`, else the attribute docstring of the class that declares it (as
    `use_attribute_docstrings` would set it)."""
    if field.description is not None:
        return field.description
    for cls in model.__mro__:
        if name in inspect.get_annotations(cls):
            return _docstrings(cls).get(name, "")
    return ""


def _describe(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    text = " ".join(_field_doc(model, name, field).split())
    return text.replace("|", "\\|")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds directly or as a mapping's value (else None)."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return _model_of(args[0])
    if origin in (typing.Union, types.UnionType):
        models = [m for m in (_model_of(a) for a in args) if m is not None]
        return models[0] if len(models) == 1 else None
    if origin is dict:
        return _model_of(args[1])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        if model is OptimizationSpec and name == "target":
            rows.append((path, "mapping", _default(field), _describe(model, name, field)))
            rows.extend(_target_rows(f"{path}."))
            continue
        rows.append((path, _type_name(annotation), _default(field), _describe(model, name, field)))
        inner = _model_of(annotation)
        if inner is not None:
            key = _KEY_NAMES.get(name)
            rows.extend(_rows(inner, f"{path}.{key}." if get_origin(annotation) is dict or key else f"{path}."))
    return rows


def _target_rows(prefix: str) -> list[tuple[str, str, str, str]]:
    """`target`'s fields: both kinds' in one list, each field only one kind has marked with it."""
    agent = {row[0]: row for row in _rows(AgentTarget, prefix)}
    program = {row[0]: row for row in _rows(ProgramTarget, prefix)}
    rows: list[tuple[str, str, str, str]] = []
    for path in dict.fromkeys([*program, *agent]):
        path_, type_, default, text = program.get(path) or agent[path]
        if path.endswith(".kind"):
            type_ = "`agent` \\| `program`"
        elif path not in agent:
            text = f"`kind: program` only. {text}"
        elif path not in program:
            text = f"`kind: agent` only. {text}"
        rows.append((path_, type_, default, text))
    return rows


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(YAML path, type, required or default, meaning) of every spec field, in the models' order."""
    return _rows(OptimizationSpec, "")


def render_table() -> str:
    """The reference as a Markdown table (no trailing newline)."""
    lines = ["| field | type | required / default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{path}` | {type_} | {default} | {text} |" for path, type_, default, text in reference_rows()]
    return "\n".join(lines)


def update_page(page: str) -> str:
    """`page` with the text between `BEGIN` and `END` replaced by `render_table()`.

    Raises:
        ValueError: the page lacks either marker, or has them out of order.
    """
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page needs the markers {BEGIN!r} and {END!r}, in that order")
    return page[: start + len(BEGIN)] + "\n" + render_table() + "\n" + page[end:]


def main(argv: list[str]) -> int:
    """`python -m vero.spec.reference PAGE`: rewrite the generated part of PAGE in place."""
    if len(argv) != 1:
        print("usage: python -m vero.spec.reference docs/spec.md", file=sys.stderr)
        return 2
    page = Path(argv[0])
    page.write_text(update_page(page.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
