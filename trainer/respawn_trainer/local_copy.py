"""A world change's save, kept on the host's own disk (RESPAWN_LOCAL_COPY_DIR), so that the next world on the same
machines restores without reading the checkpoint store.

respawn's own copy, not Orbax's: the installed Orbax (0.12) offers local checkpointing only as
`orbax.checkpoint.experimental.emergency`, an experimental CheckpointManager that replaces the persistent one (it
would own respawn's GCS steps, their retention and their commit), wants its own replica-slice mesh layout, and
restores locally only on the process layout that saved. What a survivor needs is smaller: the shards this process
holds, as bytes, restored bitwise where the next world gives it the same shards.

Layout: DIR/<sha256(checkpoint_uri)[:16]>/<step>/ holds `manifest.json` (every leaf's path, shape, dtype and the
index of each shard this process held, the data iterator's state, the world that saved it) and one raw file per
shard; written under a temporary name and renamed whole, so a copy is complete or absent. Only the newest step is
kept.

A copy is read only for the store's newest step (which a world of only the previous world's processes knows without
asking the store: world.Membership.restore), and only where it holds every shard the restore target's
shardings put on this process's devices (a replicated parameter: each survivor slice holds all of it), and the
data iterator's state where one is followed (a global one on any process count, a per-process one on the same
process index and count). Otherwise the restore reads the store, as without a copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("trainer")
MANIFEST = "manifest.json"


def _index(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[list[int]]:
    """A shard's index as [[start, stop], ...] (JAX gives slices, None for a whole axis)."""
    return [list(s.indices(n)[:2]) for s, n in zip(index, shape, strict=True)]


class LocalCopy:
    def __init__(self, root: str, checkpoint_uri: str) -> None:
        self.dir = Path(root) / hashlib.sha256(checkpoint_uri.encode()).hexdigest()[:16]

    def keep(self, step: int, state: Any, data: Any, data_is_global: bool, world: int | None = None) -> Path | None:
        """Write this process's shards of `state` (step `step`, saved by world `world`) and the data iterator's state;
        None on a failure (logged: the next world then reads the store)."""
        import jax
        import numpy as np

        tmp = self.dir / f".{step}.tmp-{os.getpid()}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            leaves = []
            for n, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(state)[0]):
                shards, seen = [], set()
                for k, shard in enumerate(leaf.addressable_shards):
                    index = _index(shard.index, leaf.shape)
                    if str(index) in seen:
                        continue
                    seen.add(str(index))
                    (tmp / f"{n}-{k}.bin").write_bytes(np.ascontiguousarray(np.asarray(shard.data)).tobytes())
                    shards.append({"index": index, "file": f"{n}-{k}.bin"})
                key = jax.tree_util.keystr(path)
                leaves.append({"path": key, "shape": list(leaf.shape), "dtype": str(leaf.dtype), "shards": shards})
            manifest = {"step": step, "world": world, "leaves": leaves, **_data_state(data, data_is_global)}
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            target = self.dir / str(step)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except (OSError, TypeError, ValueError) as e:
            log.warning("could not keep a local copy of step %d in %s (%s)", step, self.dir, e)
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        for old in self.dir.iterdir():
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        log.info("kept a local copy of step %d in %s", step, target)
        return target

    def kept_by(self, world: int) -> int | None:
        """The step of the copy that world `world` saved at its stop, if this host holds one."""
        try:
            folders = [f for f in self.dir.iterdir() if f.name.isdigit()]  # not a copy still being written
        except OSError:
            return None
        for folder in folders:
            try:
                manifest = json.loads((folder / MANIFEST).read_text())
            except (OSError, ValueError):
                continue
            if manifest.get("world") == world and manifest.get("step") == int(folder.name):
                return int(folder.name)
        return None

    def read(self, step: int, template: Any, data: Any) -> tuple[Any, Any] | None:
        """(state, data iterator state) of step `step` on the template's shardings, or None where the copy cannot
        give every shard this process needs (or the data state)."""
        folder = self.dir / str(step)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            data_state = _usable_data_state(manifest, data)
            if data is not None and data_state is None:
                return None
            return _arrays(folder, manifest, template), data_state
        except (OSError, ValueError, KeyError, TypeError) as e:
            if not isinstance(e, FileNotFoundError):
                log.warning("the local copy of step %d cannot be used (%s): reading the store", step, e)
            return None


def _arrays(folder: Path, manifest: dict[str, Any], template: Any) -> Any:
    import jax
    import numpy as np

    saved = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    paths, tree = jax.tree_util.tree_flatten_with_path(template)

    def restore(path: Any, leaf: Any) -> Any:
        entry = saved[jax.tree_util.keystr(path)]
        if entry["shape"] != list(leaf.shape) or entry["dtype"] != str(leaf.dtype):
            raise ValueError(f"{jax.tree_util.keystr(path)} is {entry['shape']} {entry['dtype']} in the copy")
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            raise ValueError(f"{jax.tree_util.keystr(path)} has no sharding in the restore target")
        files = {str(s["index"]): s["file"] for s in entry["shards"]}

        def shard(index: tuple[slice, ...] | None) -> Any:
            bounds = _index(index or (), leaf.shape)
            name = files.get(str(bounds))
            if name is None:
                raise KeyError(f"{jax.tree_util.keystr(path)} shard {bounds} is not in the copy")
            shape = [stop - start for start, stop in bounds]
            return np.frombuffer((folder / name).read_bytes(), dtype=leaf.dtype).reshape(shape)

        return jax.make_array_from_callback(tuple(leaf.shape), sharding, shard)

    return jax.tree_util.tree_unflatten(tree, [restore(path, leaf) for path, leaf in paths])


def _data_state(data: Any, is_global: bool) -> dict[str, Any]:
    if data is None:
        return {"data": None}
    import jax

    state = data.get_state()
    kind = "bytes" if isinstance(state, bytes) else "json"
    value = state.decode() if isinstance(state, bytes) else state
    where = [jax.process_index(), jax.process_count()]
    return {"data": {"kind": kind, "value": value, "global": is_global, "process": where}}


def _usable_data_state(manifest: dict[str, Any], data: Any) -> Any:
    """The saved iterator state where this process may restore it: a global one anywhere, else the same process."""
    saved = manifest.get("data")
    if data is None or saved is None:
        return None
    import jax

    if not saved["global"] and saved["process"] != [jax.process_index(), jax.process_count()]:
        return None
    return saved["value"].encode() if saved["kind"] == "bytes" else saved["value"]
