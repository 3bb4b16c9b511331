"""Decoding: a job message's bytes into a JSON object, before any field is read.

Size limits, UTF-8, no duplicate fields, no NaN or Infinity, no lone surrogates. Job files (JSON or YAML) are the
command line's: respawn_ops/jobfile.py reads them with the same rules.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

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
            obj = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)
        except UnicodeDecodeError:
            fail("", "the message is not UTF-8 text", "a JSON object in UTF-8")
        except DuplicateField as e:
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


class DuplicateField(ValueError):
    pass


def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateField(k)
        out[k] = v
    return out


def no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")
