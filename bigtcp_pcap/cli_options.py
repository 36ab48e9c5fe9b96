"""Command-line options generated from the config dataclasses: one declaration per knob.

A config field (``GroConfig.gro_max_size``: its type, default and the docstring under it) becomes the option
``--gro-max-size`` of every command that takes that config, with the same default and help, and the value is
checked by the dataclass itself (``__post_init__`` bounds every field to what the kernel accepts); a
rejected value is a usage error (exit 2) naming the option. ``@config_options(GroConfig, "gro")`` on a typer
command adds the options and hands the command one ``gro=GroConfig(...)`` argument instead.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import math
import textwrap
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

from .errors import UsageError


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (attribute docstrings, as GroConfig writes them)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # pragma: no cover - source not available (frozen app)
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _option_type(annotation: Any) -> tuple[Any, Callable[[Any], Any]]:
    """(type typer parses, converter to the field's value) for a field annotation."""
    args = set(typing.get_args(annotation)) if isinstance(annotation, types.UnionType) else {annotation}
    if args == {int, type(None)}:
        return int | None, lambda v: v
    if args == {int, float}:  # an int or math.inf
        return str, _int_or_inf
    if args == {bool, str}:  # "auto", true, false
        return str, _auto_bool
    if annotation in (int, float, str, bool):
        return annotation, lambda v: v
    raise TypeError(f"no command-line form for a field of type {annotation!r}")


def _int_or_inf(v: str) -> int | float:
    if v.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        return int(v)
    except ValueError:
        raise UsageError(f"expected an integer or 'inf', got {v!r}") from None


def _auto_bool(v: str) -> bool | str:
    low = v.strip().lower()
    if low in ("auto", "true", "false", "yes", "no", "1", "0"):
        return "auto" if low == "auto" else low in ("true", "yes", "1")
    raise UsageError(f"expected auto, true or false, got {v!r}")


def _default_text(v: Any) -> Any:
    """A default as the text an option of type str shows and parses back (inf, auto, true/false)."""
    if v is math.inf:
        return "inf"
    return str(v).lower() if isinstance(v, bool) else v


def config_options(cls: type, name: str, *, exclude: tuple[str, ...] = (),
                   panel: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: add one option per field of dataclass ``cls`` to a typer command, passed as ``name=cls(...)``.

    The command's own parameters keep their place; the generated options come after them."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name not in exclude]

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != name]
        convert: dict[str, Callable[[Any], Any]] = {}
        params = []
        for f in fields:
            typ, conv = _option_type(hints[f.name])
            convert[f.name] = conv
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            opt_default = _default_text(default) if typ is str else default
            flag = f"--{f.name.replace('_', '-')}"
            decls = (f"{flag}/--no-{f.name.replace('_', '-')}",) if typ is bool else (flag,)
            info = typer.Option(*decls, help=docs.get(f.name, ""), rich_help_panel=panel)
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt_default,
                                            annotation=Annotated[typ, info]))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            try:
                values = {f.name: convert[f.name](kw.pop(f.name)) for f in fields if f.name in kw}
                cfg = cls(**values)
            except (ValueError, TypeError, UsageError) as e:
                from .cli import EXIT_USAGE, _fail

                raise _fail(f"{_flag_of(str(e), fields)}{e}", EXIT_USAGE) from None
            return fn(*args, **{name: cfg}, **kw)

        new = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind == p.VAR_KEYWORD else p for p in own]
        wrapper.__signature__ = sig.replace(parameters=[*new, *params])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
        return wrapper

    return deco


def _flag_of(message: str, fields: list[dataclasses.Field]) -> str:
    """'--gro-max-size: ' when the config's error message names that field."""
    for f in fields:
        if message.startswith(f.name + " ") or f"{f.name} must" in message:
            return f"--{f.name.replace('_', '-')}: "
    return ""
