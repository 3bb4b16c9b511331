"""Decoding: a job message's bytes or a job file into a JSON object, before any field is read.

Size limits, UTF-8, no duplicate fields, no NaN or Infinity, no lone surrogates; YAML files without aliases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import yaml

from respawn.spec.values import MAX_MESSAGE_BYTES, fail, one_line, shown_key, type_name


def decode(data: bytes | str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(data, dict):
        try:
            size = len(json.dumps(data, default=str).encode("utf-8", "surrogatepass"))
        except (ValueError, TypeError, RecursionError):
            fail("", "the message cannot be represented as JSON", "a JSON object")
        obj: Any = data
    elif isinstance(data, (bytes, str)):
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        size = len(raw)
        if size > MAX_MESSAGE_BYTES:
            fail("", f"the message is {size} bytes", f"at most {MAX_MESSAGE_BYTES} bytes")
        try:
            obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        except UnicodeDecodeError:
            fail("", "the message is not UTF-8 text", "a JSON object in UTF-8")
        except _DuplicateField as e:
            fail(shown_key(e.args[0]), "the field appears twice", "each field once")
        except (ValueError, RecursionError) as e:
            fail("", f"the message is not valid JSON ({one_line(str(e))})", "a JSON object")
    else:
        fail("", f"expected JSON text or an object, got {type_name(data)}", "a JSON object")
    if size > MAX_MESSAGE_BYTES:
        fail("", f"the message is {size} bytes", f"at most {MAX_MESSAGE_BYTES} bytes")
    if not isinstance(obj, dict):
        fail("", f"expected a JSON object, got {type_name(obj)}", "a JSON object")
    try:
        bad = _unencodable(obj, "")
    except RecursionError:
        fail("", "the message is nested too deeply", "a JSON object")
    if bad is not None:
        fail(bad, "contains a character that is not valid Unicode (a lone surrogate)", "valid Unicode text")
    return obj


def _unencodable(obj: Any, path: str) -> str | None:
    """The path of the first string (key or value) that cannot be encoded as UTF-8, or None."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        sub = f"{path}[{k}]" if isinstance(k, int) else f"{path}.{shown_key(k)}" if path else shown_key(k)
        if _unencodable(k, sub) is not None:
            return sub
        found = _unencodable(v, sub)
        if found is not None:
            return found
    return None


class _DuplicateField(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateField(k)
        out[k] = v
    return out


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


# ---------------------------------------------------------------------------- files


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without anchors/aliases: a tiny file cannot expand into a huge object."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(None, None, "aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.MarkedYAMLError(None, None, f"{key_node.value!r} appears twice", key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def load_job_file(path: str | Path) -> dict[str, Any]:
    """Read a job file (JSON, or YAML: .yaml/.yml or anything that is not .json) into a dict.

    Raises SpecError when the file cannot be read, is too big, does not parse or is not an object.
    """
    p = Path(path)
    allowed = "a JSON or YAML file holding one job message object"
    try:
        size = p.stat().st_size
        if size > MAX_MESSAGE_BYTES:
            fail("", f"{p} is {size} bytes", f"at most {MAX_MESSAGE_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        fail("", f"{p} is not UTF-8 text", allowed)
    except OSError as e:
        fail("", f"cannot read {p}: {e.strerror or e}", allowed)
    try:
        if p.suffix.lower() == ".json":
            obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        else:
            obj = yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass: no arbitrary objects
    except _DuplicateField as e:
        fail(shown_key(e.args[0]), f"the field appears twice in {p}", "each field once")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        what = getattr(e, "problem", None) or type(e).__name__
        fail("", f"{p} is not valid YAML{where}: {one_line(str(what))}", allowed)
    except (ValueError, RecursionError) as e:
        kind = "JSON" if p.suffix.lower() == ".json" else "YAML"
        fail("", f"{p} is not valid {kind}: {one_line(str(e))}", allowed)
    if not isinstance(obj, dict):
        fail("", f"{p} holds {type_name(obj)}, not an object", allowed)
    return obj
