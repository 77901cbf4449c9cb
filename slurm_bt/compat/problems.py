"""Turn pydantic errors into one-line :class:`~slurm_bt.errors.Problem` s with full field paths.

pydantic's default messages ("Input should be an instance of AvailabilityModel") do not say what
to write instead, and its locs contain union member tags (``checkpoints.0._BasetenLatestCheckpoint
.typ``) that are noise to a user. This module walks the model classes along each error's loc to
know the field's type, so that it can:

* name the valid values of an enum (without private members such as ``Accelerator._B10``);
* suggest the nearest field name for an unknown keyword;
* hide the value of anything that may hold a secret (``SecretReference`` fields, environment);
* collapse union alternatives to the one the user evidently meant.
"""

from __future__ import annotations

import difflib
import enum
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import pydantic

from slurm_bt.compat.definitions import SecretReference
from slurm_bt.errors import Problem

__all__ = ["format_loc", "problems_from_errors"]

_MAX_REPR = 60
_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a bool (True or False)",
    "list_type": "a list",
    "dict_type": "a dict",
    "none_required": "None",
}
_SHOW_INPUT = frozenset(
    {
        *_TYPE_WORDS,
        "enum",
        "is_instance_of",
        "literal_error",
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "string_too_short",
        "model_type",
        "model_attributes_type",
    }
)


@dataclass
class _Resolved:
    """An error's loc mapped onto the model classes."""

    path: list[str | int]  # loc without union member tags
    annotation: Any  # type of the field at the end of the loc (Any when unknown)
    owner: type[pydantic.BaseModel] | None  # model owning the last path segment
    secret: bool  # the value may be a secret: never echo it
    union_path: tuple[str | int, ...] | None = None  # path of the union value, if a tag was seen
    tag: str | None = None
    after_tag: tuple[str | int, ...] = ()


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _non_none(tp: Any) -> list[Any]:
    return [a for a in typing.get_args(tp) if a is not type(None)]


def _resolve(root: type[pydantic.BaseModel], loc: Sequence[str | int]) -> _Resolved:
    """Follow ``loc`` through fields, lists, dicts and unions, starting at ``root``."""
    res = _Resolved(path=[], annotation=root, owner=None, secret=False)
    tp: Any = root
    i = 0
    while i < len(loc):
        seg = loc[i]
        if _is_union(tp):
            members = _non_none(tp)
            if len(members) == 1:
                tp = members[0]
                continue
            chosen = next((m for m in members if _type_name(m) == seg), None)
            if chosen is not None and res.tag is None:
                res.union_path, res.tag, res.after_tag = tuple(res.path), str(seg), tuple(loc[i + 1 :])
                tp = chosen
                i += 1
                continue
            tp = Any
        origin = typing.get_origin(tp)
        if origin in (list, tuple, set, frozenset) and isinstance(seg, int):
            args = typing.get_args(tp)
            tp = args[0] if args else Any
        elif origin is dict:
            args = typing.get_args(tp)
            tp = args[1] if len(args) == 2 else Any
            # Environment values are plain strings as often as secrets: never echo them.
            res.secret = res.secret or any(p == "environment_variables" for p in res.path)
        elif isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
            res.owner = tp
            field = tp.model_fields.get(seg) if isinstance(seg, str) else None
            tp = field.annotation if field is not None else Any
        else:
            tp = Any
        res.path.append(seg)
        res.secret = res.secret or _mentions_secret(tp)
        i += 1
    res.annotation = _non_none(tp)[0] if _is_union(tp) and len(_non_none(tp)) == 1 else tp
    return res


def _mentions_secret(tp: Any) -> bool:
    if tp is SecretReference:
        return True
    return any(_mentions_secret(a) for a in typing.get_args(tp))


def format_loc(path: Iterable[str | int], prefix: str = "") -> str:
    """``job.weights[0].mount_location``; dict keys that are not identifiers get ``['a.b']``."""
    out = prefix
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        elif seg.isidentifier():
            out += f".{seg}" if out else seg
        else:
            out += f"[{seg!r}]"
    return out


def _got(value: Any, secret: bool) -> str:
    if secret:
        return f"a value of type {type(value).__name__}"
    text = repr(value)
    if len(text) > _MAX_REPR:
        text = text[: _MAX_REPR - 3] + "..."
    return f"{text} ({type(value).__name__})"


def _public_values(cls: type[enum.Enum]) -> list[str]:
    """Enum values users may write; private members (``_B10``) are valid but not advertised."""
    return [str(m.value) for m in cls if not m.name.startswith("_")]


def _enum_message(err: dict[str, Any], res: _Resolved) -> str | None:
    cls = res.annotation
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        return None
    value = err.get("input")
    if err["type"] == "enum":
        return f"{value!r} is not one of {', '.join(_public_values(cls))}"
    # Strict classes accept members only: say which member the string meant.
    member = next((m for m in cls if value in (m.value, m.name)), None)
    if member is not None:
        return (
            f"got the string {value!r}; write {cls.__name__}.{member.name} "
            "(this field takes enum members, not strings)"
        )
    names = ", ".join(f"{cls.__name__}.{m.name}" for m in cls if not m.name.startswith("_"))
    return f"expected one of {names}, got {_got(value, res.secret)}"


def _message(err: dict[str, Any], res: _Resolved) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        name = str(res.path[-1]) if res.path else "?"
        valid = list(res.owner.model_fields) if res.owner is not None else []
        close = difflib.get_close_matches(name, valid, n=1)
        if close:
            return f"unknown field {name!r}; did you mean {close[0]!r}?"
        return f"unknown field {name!r}; valid fields: {', '.join(valid)}"
    if kind in ("enum", "is_instance_of"):
        special = _enum_message(err, res)
        if special is not None:
            return special
    if kind in ("value_error", "assertion_error"):
        msg = str(err.get("msg", ""))
        for noise in ("Value error, ", "Assertion failed, "):
            msg = msg.removeprefix(noise)
        return msg
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {_got(err.get('input'), res.secret)}"
    msg = str(err.get("msg", kind))
    if kind in _SHOW_INPUT:
        msg += f", got {_got(err.get('input'), res.secret)}"
    return msg


def _union_problems(entries: list[tuple[dict[str, Any], _Resolved]], prefix: str) -> list[Problem]:
    """Keep only the union alternative the user meant; if none is evident, say what was expected."""
    by_tag: dict[str, list[tuple[dict[str, Any], _Resolved]]] = {}
    for entry in entries:
        by_tag.setdefault(entry[1].tag or "", []).append(entry)
    # An alternative whose ``typ`` discriminator does not match was not meant.
    meant = {
        t: es
        for t, es in by_tag.items()
        if not any(e["type"] == "literal_error" and r.after_tag == ("typ",) for e, r in es)
    } or by_tag
    # Alternatives that got past the top-level type check match the shape the user wrote.
    deeper = {t: es for t, es in meant.items() if any(r.after_tag for _, r in es)}
    chosen = deeper or meant
    first_err, first_res = entries[0]
    loc = format_loc(first_res.union_path or (), prefix)
    if not deeper and len(chosen) > 1:
        names = " or ".join(chosen)
        return [Problem(loc, f"expected {names}, got {_got(first_err.get('input'), first_res.secret)}")]
    out = []
    for tag, es in chosen.items():
        suffix = f" (as {tag})" if len(chosen) > 1 else ""
        for err, res in es:
            out.append(Problem(format_loc(res.path, prefix), _message(err, res) + suffix))
    return out


def problems_from_errors(
    errors: Iterable[dict[str, Any]], root: type[pydantic.BaseModel], prefix: str = ""
) -> list[Problem]:
    """One :class:`Problem` per error of ``root.model_validate``, in pydantic's order.

    Args:
        errors: ``ValidationError.errors()`` entries, locs relative to ``root``.
        root: the model class that was validated.
        prefix: prepended to every loc (the loader uses the class name for objects that are not
            part of the project, e.g. ``Compute.node_count``).
    """
    problems: list[Problem] = []
    unions: dict[tuple[str | int, ...], list[tuple[dict[str, Any], _Resolved]]] = {}
    order: list[tuple[str | int, ...] | None] = []
    singles: list[tuple[dict[str, Any], _Resolved]] = []
    for err in errors:
        res = _resolve(root, tuple(err.get("loc", ())))
        if res.union_path is not None:
            if res.union_path not in unions:
                order.append(res.union_path)
            unions.setdefault(res.union_path, []).append((err, res))
        else:
            order.append(None)
            singles.append((err, res))
    single_iter = iter(singles)
    for key in order:
        if key is None:
            err, res = next(single_iter)
            problems.append(Problem(format_loc(res.path, prefix), _message(err, res)))
        else:
            problems.extend(_union_problems(unions[key], prefix))
    return problems
