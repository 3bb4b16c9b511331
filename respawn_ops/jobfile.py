"""A job file (JSON, or YAML without aliases) into a job message object: what `respawn submit`, `respawn doctor`
and `respawn local run` read. The deployed functions take JSON messages only (respawn.spec.decoding)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from respawn.spec.decoding import DuplicateField, no_constant, no_duplicates
from respawn.spec.values import MAX_MESSAGE_BYTES, fail, one_line, shown_key, type_name


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
            obj = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
        else:
            obj = yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass: no arbitrary objects
    except DuplicateField as e:
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
