"""A world's metadata write, the part both machine APIs share (docs/design/several-slices.md, Telling the machines):
the machine's metadata with the key `respawn-world` set to the new world, unless the key already holds a world of the
same or a newer version, which a write delivered late or twice leaves as it is.

A world is JSON with an integer "version" (respawn.jobs.World.to_json). A value already there that is not one (not
JSON, no version, a version that is no integer) is overwritten.
"""

from __future__ import annotations

import json

from respawn.adapters.startup import WORLD_METADATA
from respawn.ports import PermanentError


def world_version(text: str | None) -> int | None:
    """The integer "version" of a world's JSON; None when there is none or `text` is no world."""
    if text is None:
        return None
    try:
        value = json.loads(text)
        return int(value["version"]) if isinstance(value, dict) else None
    except (ValueError, TypeError, KeyError):  # json.JSONDecodeError is a ValueError
        return None


def with_world(metadata: dict[str, str], world: str) -> dict[str, str] | None:
    """`metadata` with `respawn-world` = `world`, every other key as it is; None when the key already holds this
    version or a newer one (nothing to write)."""
    version = world_version(world)
    if version is None:
        raise PermanentError(f"the world to write is not JSON with an integer version: {world[:200]!r}")
    held = world_version(metadata.get(WORLD_METADATA))
    if held is not None and held >= version:
        return None
    return {**metadata, WORLD_METADATA: world}
