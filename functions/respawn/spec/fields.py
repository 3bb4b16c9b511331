"""The table of fields: how one object of the message is read into its model and written back.

A `Shape` lists an object's fields (`Field`: its parser, its renderer, its model attribute); `Reading` reads one
object against its shape (unknown and missing fields first, then each field on first use), `render` writes it back.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from respawn.spec.values import Parse, expect_type, fail, only


def _as_is(value: Any) -> Any:
    return value


def _shown_always(model: Any) -> bool:
    return True


@dataclass(frozen=True)
class Field:
    """One field of a message object: how its value is read into the model and written back.

    An absent field takes the model's default for its attribute (respawn.jobs), so each default is written once; the
    message shows it as render(default).
    """

    name: str  # the key in the message
    parse: Parse  # (value, path) -> the model's value, or SpecError naming the path
    render: Callable[[Any], Any] = _as_is  # the model's value -> the message's value
    attribute: str = ""  # the model's attribute, when it is not `name` (ttl -> ttl_s); "" for the name
    required: bool = False
    shown_if: Callable[[Any], bool] = _shown_always  # spec_to_message writes it when this holds for the model
    omitted_when_default: bool = False  # ... and, when set, only while it differs from its default

    @property
    def model_name(self) -> str:
        return self.attribute or self.name


@dataclass(frozen=True)
class Shape:
    """A message object: its fields in the order an unknown-field error lists them, and the model it becomes."""

    model: type  # the frozen dataclass the fields fill in: its defaults are the fields' defaults
    fields: tuple[Field, ...]
    missing_allowed: str = ""  # the `allowed` of a missing required field: "required for kind tpu"
    tag: tuple[str, str] | None = None  # the field saying which object this is, and its value: ("kind", "tpu")

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The fields this object may have, as an unknown-field error lists them."""
        return (*(self.tag[:1] if self.tag else ()), *(f.name for f in self.fields))

    @functools.cached_property
    def model_fields(self) -> tuple[Field, ...]:
        """The fields that are attributes of the model (a tier's move_on is not: its fields are)."""
        attributes = {f.name for f in dataclasses.fields(self.model)}
        return tuple(f for f in self.fields if f.model_name in attributes)

    @functools.cached_property
    def by_name(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields}

    @functools.cached_property
    def defaults(self) -> dict[str, Any]:
        """What an absent field means: the model's default for its attribute (required fields have none)."""
        model_defaults = {f.name: f.default for f in dataclasses.fields(self.model)}
        return {
            f.name: model_defaults[f.model_name]
            for f in self.model_fields
            if model_defaults[f.model_name] is not dataclasses.MISSING
        }


class Reading:
    """One message object being read. Unknown and missing fields are rejected at once; then each field is parsed on
    first use (an absent one is its default), so a reader may check first the fields that others depend on."""

    def __init__(self, shape: Shape, message: Any, path: str) -> None:
        expect_type(path, message, dict, "an object")
        only(path, message, shape.names)
        for f in shape.fields:
            if f.required and f.name not in message:
                fail(join_path(path, f.name), "missing", shape.missing_allowed)
        self.shape, self.message, self.path = shape, message, path
        self._values: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            given = name in self.message
            parse = self.shape.by_name[name].parse
            self._values[name] = (
                parse(self.message[name], join_path(self.path, name)) if given else self.shape.defaults[name]
            )
        return self._values[name]

    def check(self, *names: str) -> None:
        """Validate these fields now, in this order: a rule that reads fields out of the table's order (because
        others depend on them, or to report one error before another) says so here, and their values are kept."""
        for name in names:
            self[name]

    def set(self, name: str, value: Any) -> None:
        """A field's value taken from elsewhere in the message (a tiered job's zones are its first tier's)."""
        self._values[name] = value

    def model_values(self) -> dict[str, Any]:
        """The model's attributes, read in the table's order (after any the reader read first)."""
        return {f.model_name: self[f.name] for f in self.shape.model_fields}


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def render(shape: Shape, model: Any) -> dict[str, Any]:
    """The message object of a model value, the inverse of reading it: the tag first, then the fields shown."""
    message: dict[str, Any] = dict([shape.tag]) if shape.tag else {}
    for f in shape.model_fields:
        value = getattr(model, f.model_name)
        if f.shown_if(model) and not (f.omitted_when_default and value == shape.defaults[f.name]):
            message[f.name] = f.render(value)
    return message
