"""Overrides of any model's args dataclass from a command line (the --spec flag): "layers=4,heads=2" -> replace().

The args bases (assay.models.common.args: ModelArgs.parse_overrides / with_overrides) call these with
the class's alias map ("layers" -> "n_layers") and family name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from assay.core.errors import AssayError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _field_types(args_type: type) -> dict[str, str]:
    # The args modules use `from __future__ import annotations`: a field's type is its annotation text.
    return {f.name: f.type for f in fields(args_type)}


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, so "mlp_only_layers=[0,2],layers=4" is two items."""
    items, depth, current = [], 0, []
    for char in text:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _parse_value(args_type: type, field_name: str, kind: str, raw: str) -> Any:
    text = raw.strip()
    try:
        if kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(text)
        if kind == "str":
            return text
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "float | None":
            return None if text.lower() in ("none", "null", "") else float(text)
        if kind.startswith("tuple"):
            inner = text.strip("[]()").strip()
            return tuple(int(part) for part in re.split(r"[,;\s]+", inner) if part)
    except ValueError:
        raise AssayError(f"spec override {field_name}={raw!r}: not a valid {kind}") from None
    raise AssertionError(f"{args_type.__name__} field {field_name} has a type ({kind}) the override parser does not know")


def parse_overrides(text: str, args_type: type, aliases: Mapping[str, str], family: str) -> dict[str, Any]:
    """ "layers=4,heads=2" -> {"n_layers": 4, "n_heads": 2} for args_type's fields; AssayError on a bad item."""
    field_types = _field_types(args_type)
    overrides: dict[str, Any] = {}
    for item in _split_top_level(text):
        if "=" not in item:
            raise AssayError(f"spec override {item!r} is not NAME=VALUE")
        name, raw = (part.strip() for part in item.split("=", 1))
        field_name = aliases.get(name, name)
        if field_name not in field_types:
            known = sorted(set(field_types) | set(aliases))
            raise AssayError(f"spec override {name!r} is not a {family} field; known: {', '.join(known)}")
        overrides[field_name] = _parse_value(args_type, field_name, field_types[field_name], raw)
    return overrides


def resolve_overrides(
    overrides: str | Mapping[str, Any], args_type: type, aliases: Mapping[str, str], family: str
) -> dict[str, Any]:
    """Overrides given as a CLI string or a mapping (aliases allowed) -> {field name: value}."""
    if isinstance(overrides, str):
        return parse_overrides(overrides, args_type, aliases, family)
    field_types = _field_types(args_type)
    resolved = {}
    for name, value in overrides.items():
        field_name = aliases.get(name, name)
        if field_name not in field_types:
            raise AssayError(f"spec override {name!r} is not a {family} field")
        resolved[field_name] = value
    return resolved
