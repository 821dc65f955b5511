"""Reading a param group's hyper-parameters: the engine's Hyper of a group, field by field as the algorithm's
descriptor lists them (_C.algorithms[name]["fields"], from kFields in src/algos/<algo>.h: the one mapping between
torch's param_group keys and the Hyper's fields), each number as one float, or an error naming the field."""

from __future__ import annotations

from typing import NamedTuple


class _BadNumber(Exception):
    """A group field that float() refused (see group_number); _pack names the group."""

    def __init__(self, field: str, value, index: int | None = None):
        super().__init__(field)
        self.field, self.value, self.index = field, value, index  # index: the value has no element [index]


def group_number(group: dict, key: str, index: int | None = None) -> float:
    """float(group[key]) (or of group[key][index], e.g. betas); a value that is not one number (a
    2-element tensor, a string) raises _BadNumber naming the field."""
    try:
        value = group[key] if index is None else group[key][index]
    except (IndexError, TypeError):  # betas=(0.9,), or not a sequence: torch's step fails to unpack it
        raise _BadNumber(f"['{key}']", group[key], index) from None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise _BadNumber(f"['{key}']" + ("" if index is None else f"[{index}]"), value) from None


class GroupField(NamedTuple):
    """One Hyper field and where torch's param_group keeps it (algos::Field in src/algos/descriptor.h)."""

    name: str  # the Hyper's keyword
    key: str  # the param_group key
    index: int | None  # the part of a tuple-valued key (betas[1]: 1); None: the whole value
    kind: str  # "bool", "number" or "choice" (an int the group holds by name: choices[value])
    optional: bool  # the group may lack the key: the Hyper's default stands
    nullable: bool  # the group may hold None: the Hyper's default stands (a class may say better)
    choices: tuple


def group_fields(entry: dict) -> tuple[GroupField, ...]:
    """The fields of an algorithm, from its _C.algorithms entry."""
    return tuple(GroupField(f["name"], f["key"], None if f["index"] < 0 else f["index"], f["kind"], f["optional"],
                            f["nullable"], tuple(f["choices"])) for f in entry["fields"])


def hyper_arguments(fields: tuple[GroupField, ...], group: dict) -> dict:
    """The Hyper's keyword arguments from param group `group`, in the descriptor's order: booleans as bool(), numbers
    through group_number, names of choices as their codes. A missing key raises KeyError, as torch's step does, unless
    the field is optional; a bad number raises _BadNumber; an unknown choice ValueError, as the reference's
    constructor says it."""
    arguments = {}
    for name, key, index, kind, optional, nullable, choices in fields:  # (unpacked: this runs at every step)
        if optional and key not in group:
            continue
        if kind == "bool":
            arguments[name] = bool(group[key])
        elif kind == "choice":
            value = group[key]
            if not (isinstance(value, str) and value in choices):
                raise ValueError(f"Invalid {key} parameter: {value}")
            arguments[name] = choices.index(value)
        elif not (nullable and _peek(group, key, index) is None):
            arguments[name] = group_number(group, key, index)
    return arguments


def _peek(group: dict, key: str, index: int | None):
    """group[key] (or its [index]), or ... where it has no such part (group_number then says so)."""
    try:
        return group[key] if index is None else group[key][index]
    except (IndexError, TypeError):
        return ...
