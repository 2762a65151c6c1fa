"""Every field of a spec part checked against its own annotation, when the part is made.

Written here rather than taken from a validation library (pydantic, attrs' validators): the spec's
parts are plain frozen dataclasses that pickle to Beam's workers unchanged, their annotations are
a handful of simple forms, and one check over all of them means that a field added later is
type-checked without anyone remembering to. A value of the wrong type then fails where it is
given, naming the part and the field, instead of deep in a worker (``num_shards=2.5`` as a shard
name's format error, ``width=32.5`` as every image's dead letter).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from beam_jobs.errors import UsageError

__all__ = ["check_field_types"]


def check_field_types(part: Any) -> None:
    """Raises UsageError naming the first field of the dataclass instance ``part`` whose value does
    not have its annotated type. Booleans are not numbers here, and a whole number is a float."""
    hints = typing.get_type_hints(type(part))
    for field in dataclasses.fields(part):
        value = getattr(part, field.name)
        if not _has_type(value, hints[field.name]):
            raise UsageError(
                f"{type(part).__name__}.{field.name} must be {_describe(hints[field.name])} (got {value!r})"
            )


def _has_type(value: Any, annotation: Any) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_has_type(item, args[0]) for item in value)
        return len(value) == len(args) and all(_has_type(item, arg) for item, arg in zip(value, args, strict=True))
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        key, item = args
        return isinstance(value, Mapping) and all(_has_type(k, key) and _has_type(v, item) for k, v in value.items())
    return isinstance(value, annotation)


def _describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if annotation is type(None):
        return "None"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple, each item {_describe(args[0])}"
        return f"a tuple of {len(args)}: {', '.join(_describe(arg) for arg in args)}"
    if origin is not None:
        return f"a mapping from {_describe(args[0])} to {_describe(args[1])}"
    names = {bool: "True or False", int: "a whole number", float: "a number", str: "a string"}
    return names.get(annotation, f"a {getattr(annotation, '__name__', annotation)}")
