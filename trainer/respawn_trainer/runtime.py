"""JAX process setup for a respawn machine: XLA flags, the persistent compilation cache (local or gs://),
multi-host init through JAX's own multi-controller runtime, and the few cross-host agreements the loop needs.

Everything here imports JAX lazily: a trainer that does not use JAX (or a config error) never pays for it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, cast

from respawn_trainer.env import COORDINATOR_PORT, RunEnv
from respawn_trainer.failures import PERMANENT_RC as PERMANENT_RC  # re-exported
from respawn_trainer.failures import Permanent, compiling

log = logging.getLogger("trainer")

# Single-threaded Eigen on the CPU backend: the same reductions in the same order on every machine size.
CPU_DETERMINISM_FLAGS = "--xla_cpu_multi_thread_eigen=false"
# On a GPU machine: XLA's deterministic implementations of scatter, GEMMs, convolutions and attention, and no
# autotuning (which may pick other kernels at each compile), so that a restored run computes what the lost one would
# have (https://openxla.org/xla/determinism; docs/gpus.md, Exact resumption on GPUs). Every XLA build knows the flag,
# so the local cloud's CPU stand-ins for a GPU run with it too.
GPU_DETERMINISM_FLAGS = "--xla_gpu_deterministic_ops=true"


def determinism_flags(run: RunEnv) -> list[str]:
    """The XLA flags a trainer on this machine adds to XLA_FLAGS (unless already there)."""
    return [CPU_DETERMINISM_FLAGS] + ([GPU_DETERMINISM_FLAGS] if run.accelerator == "gpu" else [])


# Part of every stored program's key: programs stored in an older format are never read.
STORED_PROGRAM_FORMAT = "kept-2"
CACHE_PROBE_TIMEOUT_S = 10.0  # an unreachable gs:// cache costs this long once, then the run compiles without it


class Placement(NamedTuple):
    """This process's place in a world of several slices (respawn_trainer.world): JAX's multi-controller runtime is
    formed over every host of every member slice, so the coordinator, process id and count are the world's."""

    coordinator: str
    process_id: int
    process_count: int


def wants_distributed(run: RunEnv, mode: str = "auto", world: Placement | None = None) -> bool:
    """On a multi-host TPU slice every worker runs the trainer; TPU_WORKER_HOSTNAMES lists them all. In a world, it
    is the world's process count that counts."""
    if mode != "auto":
        return mode == "on"
    if world is not None:
        return world.process_count > 1
    return len(run.worker_hostnames) > 1


def initialize_args(run: RunEnv, world: Placement | None = None) -> dict[str, Any]:
    """The arguments of jax.distributed.initialize(): the world's placement in a world; explicit from TPU_WORKER_ID /
    TPU_WORKER_HOSTNAMES when both are set (JAX_COORDINATOR_ADDRESS, else the first host on port 8482), else JAX's own
    auto-detection."""
    args: dict[str, Any] = {"heartbeat_timeout_seconds": run.heartbeat_timeout_s}
    if world is not None:
        args.update(coordinator_address=world.coordinator, num_processes=world.process_count)
        args["process_id"] = world.process_id
    elif run.worker_id is not None and run.worker_hostnames:
        hosts = run.worker_hostnames
        args["coordinator_address"] = run.coordinator_address or f"{hosts[0]}:{COORDINATOR_PORT}"
        args["num_processes"] = len(hosts)
        args["process_id"] = run.worker_id
    return args


COORDINATOR_WAIT_S = (0.02, 30.0)  # how often, and up to how long, a peer looks for the coordinator's port


def await_listening(address: str) -> None:
    """Wait until the coordinator's port takes a TCP connection (or COORDINATOR_WAIT_S runs out; then
    jax.distributed.initialize waits as it does). A peer that asks JAX's coordination service before it listens backs
    off for about a second (gRPC's reconnect backoff), which a world re-formed in place would pay each time: its
    processes reach the new world together, while process 0 is still starting the service."""
    host, _, port = address.rpartition(":")
    every, wait_s = COORDINATOR_WAIT_S
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=every * 10).close()
            return
        except OSError:
            time.sleep(every)


class JaxConfig(Protocol):
    """The options of `jax.config` read here: JAX defines them at run time, so its class declares none."""

    jax_compilation_cache_dir: str | None
    jax_enable_compilation_cache: bool

    def update(self, name: str, val: object) -> None: ...


def jax_config() -> JaxConfig:
    import jax

    return cast(JaxConfig, jax.config)


def configure(run: RunEnv, distributed: str = "auto", world: Placement | None = None) -> None:
    """Call before the first JAX computation: flags, multi-host init (over the whole world when given one), then the
    compilation cache."""
    for flag in determinism_flags(run):
        if flag.partition("=")[0] + "=" not in os.environ.get("XLA_FLAGS", ""):  # the job's own setting stands
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    import jax

    if wants_distributed(run, distributed, world):
        # JAX's preemption service installs its own SIGTERM handler, which would swallow the notice:
        # the trainer watches SIGTERM itself and agrees on it across processes (agree_any).
        jax_config().update("jax_enable_preemption_service", False)
        args = initialize_args(run, world)
        if args.get("process_id", 0) != 0 and args.get("coordinator_address"):
            await_listening(args["coordinator_address"])
        jax.distributed.initialize(**args)
        log.info(
            "process %d of %d (%d local devices of %d), heartbeat timeout %ds",
            jax.process_index(),
            jax.process_count(),
            jax.local_device_count(),
            jax.device_count(),
            run.heartbeat_timeout_s,
        )
    check_devices(run)
    if run.compile_cache:
        use_compile_cache(run.compile_cache)


class WrongDevices(Permanent):
    """The machine has an accelerator that JAX does not see (an image of the wrong variant, a missing runtime or
    driver): every machine of the job would train at CPU speed, so the failure is permanent, not retried. A program
    exits with PERMANENT_RC on it."""


# How to give JAX the machine's accelerator (docs/trainer-protocol.md, Devices)
DEVICE_FIXES = {
    "tpu": "run an image with jax[tpu] (respawn's: docker build --build-arg VARIANT=tpu trainer/)",
    "gpu": "run an image with JAX's CUDA wheels (jax[cuda12]) on a GPU image with the NVIDIA driver, with --gpus all",
}


def check_devices(run: RunEnv) -> None:
    """Fail at once when the machine's accelerator (RESPAWN_ACCELERATOR) is not what JAX found, unless the local
    cloud says its CPU processes stand in for it (RESPAWN_DEVICES_STAND_IN)."""
    import jax

    found, wanted = jax.default_backend(), run.accelerator
    if wanted is None or found == wanted:
        return
    devices = f"{jax.device_count()} {found.upper()} device(s)"
    if found == run.stand_in:
        log.info("%s stand in for the machine's %s (the local cloud)", devices, wanted.upper())
        return
    raise WrongDevices(
        f"the machine has a {wanted.upper()} but JAX found only {devices}: the image's JAX or the machine's "
        f"{wanted.upper()} runtime is wrong; fix: {DEVICE_FIXES[wanted]}"
    )


def cache_dir(base: str) -> str:
    """Programs are only valid for one accelerator shape and one JAX: key the directory by both."""
    import jax

    device = jax.devices()[0]
    kind = re.sub(r"[^a-z0-9]+", "-", f"{device.platform}-{device.device_kind}".lower()).strip("-")
    return f"{base}/{kind}-{jax.device_count()}x{jax.process_count()}-jax{jax.__version__}"


def use_compile_cache(base: str) -> str | None:
    """Point JAX's persistent compilation cache at `base` (keyed below it); None when it cannot be reached.

    A gs:// cache is probed first with a deadline, so an unreachable bucket costs a warning and a compile,
    never a hang (JAX's own reads would retry for minutes)."""
    path = cache_dir(base)
    error = _probe(path)
    if error:
        log.warning("compilation cache %s unreachable (%s): compiling without it", path, error)
        return None
    config = jax_config()
    config.update("jax_compilation_cache_dir", path)
    config.update("jax_persistent_cache_min_compile_time_secs", 0)
    config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _probe(path: str) -> str | None:
    """None when `path` can be listed (created if local) within the deadline, else what went wrong."""
    if not path.startswith("gs://"):
        try:
            os.makedirs(path, exist_ok=True)
            return None
        except OSError as e:
            return str(e)
    result: list[str | None] = []

    def probe() -> None:
        try:
            import fsspec

            fs, root = fsspec.core.url_to_fs(path)
            fs.ls(root.split("/", 1)[0])  # the bucket answers
            result.append(None)
        except Exception as e:
            result.append(f"{type(e).__name__}: {e}".splitlines()[0][:200])

    thread = threading.Thread(target=probe, name="compile-cache-probe", daemon=True)
    thread.start()
    thread.join(CACHE_PROBE_TIMEOUT_S)
    return result[0] if result else f"no answer within {CACHE_PROBE_TIMEOUT_S:.0f}s"


def compiled(jitted: Any, *args: Any, key: str | None = None) -> Any:
    """`jitted` compiled ahead of time for `args` (arrays, or ShapeDtypeStructs with shardings).

    Through JAX's persistent cache, which traces and lowers the function to find its entry. With `key` (naming
    the function's code and all it closes over, e.g. a hash of its source and config) the executable is stored
    under that key, so a restart skips tracing and lowering too; a wrong key gives a wrong program. A stored
    one is returned as a `Program` that loads in the background while the caller goes on (restoring the
    checkpoint, say); `Run.restore` waits for it, and every host for theirs, before it reports the start.

    A program that does not trace or compile raises CompileFailed (failures.compiling): permanent, not retried."""
    import jax

    cache = jax_config().jax_compilation_cache_dir
    if cache and key is not None:
        store = _ProgramStore(cache, _program_key(key, args))
        return Program(store, lambda: compiling(lambda: jitted.lower(*args).compile()))
    lowered = compiling(lambda: jitted.lower(*args))
    # Not a local-only case: JAX's cache is written by process 0 alone, and XLA:CPU keys each process's programs
    # by its own topology, so every other process of any multi-process CPU run would compile at each start.
    if not cache or jax.process_count() == 1 or jax.default_backend() != "cpu":
        return compiling(lowered.compile)
    store = _ProgramStore(cache, _program_key(lowered.as_text(), args))
    stored = store.read()
    return stored if stored is not None else compiling(lambda: store.build(lowered.compile))


def _program_key(text: str, args: Any) -> str:
    import jax

    device = jax.devices()[0]
    parts = [
        STORED_PROGRAM_FORMAT,
        text,
        str(jax.tree.map(lambda a: (a.shape, a.dtype, getattr(a, "sharding", None)), args)),
        jax.__version__,
        device.client.platform_version,
        f"{device.device_kind} x{jax.device_count()} p{jax.process_index()}/{jax.process_count()}",
        os.environ.get("XLA_FLAGS", ""),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class _ProgramStore:
    """Where the executable of one key lives in this process's part of the cache.

    Built outside JAX's cache: on CPU an executable read from that cache serializes without its code, and the
    stored copy would fail at its first run ("Function ... not found")."""

    def __init__(self, cache: str, key: str) -> None:
        import fsspec
        import jax
        from jax.experimental import serialize_executable

        # Imported here, on the caller's thread: read() may run on another one, which must import nothing
        # (two threads importing the same modules can deadlock on the import locks).
        self._serialization = serialize_executable
        self.fs, root = fsspec.core.url_to_fs(f"{cache}/respawn-programs/p{jax.process_index()}")
        self.root, self.path = root, f"{root}/{key}"

    def read(self) -> Any:
        """The stored executable, loaded; None when there is none or it cannot be loaded (then: a compile)."""
        try:
            return self._serialization.deserialize_and_load(*pickle.loads(self.fs.cat_file(self.path)))
        except FileNotFoundError:
            return None
        except Exception as e:  # a damaged entry is a compile, not a failure
            log.warning("stored program %s unreadable (%s): compiling", self.path, type(e).__name__)
            return None

    def build(self, build: Callable[[], Any]) -> Any:
        """`build()`, stored for the next start."""
        executable = _without_jax_cache(build)
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            self.fs.pipe_file(tmp, pickle.dumps(self._serialization.serialize(executable)))
            self.fs.mv(tmp, self.path)
        except Exception as e:
            log.warning("could not store the compiled program (%s)", type(e).__name__)
        return executable


_loading: list[Program] = []  # programs whose background load Run.restore has not waited for yet


class Program:
    """A stored program being read and loaded on a background thread (C++ that releases the GIL: it overlaps the
    caller's imports and restore). Called like the executable; the first call waits for it, and compiles it on
    the caller's thread when it was not stored (JAX's cache settings are process-wide: one thread changes them)."""

    def __init__(self, store: _ProgramStore, build: Callable[[], Any]) -> None:
        self._store, self._build = store, build
        self._loaded: list[Any] = []
        self._executable: Any = None
        self._thread = threading.Thread(
            target=lambda: self._loaded.append(store.read()), name="program-load", daemon=True
        )
        self._thread.start()
        _loading.append(self)

    def executable(self) -> Any:
        if self._executable is None:
            self._thread.join()
            loaded = self._loaded[0] if self._loaded else None
            self._executable = loaded if loaded is not None else self._store.build(self._build)
        return self._executable

    def __call__(self, *args: Any) -> Any:
        return self.executable()(*args)


def programs_ready() -> None:
    """Wait for every program compiled() is loading (compiling those not stored), then for every host to have
    theirs: the first collective after it then finds every peer at it (gloo gives up on one after 30 s)."""
    while _loading:
        _loading.pop().executable()
    barrier("compiled")


def _without_jax_cache(build: Callable[[], Any]) -> Any:
    """`build()` compiled by XLA with JAX's persistent cache neither read nor written."""
    from jax.experimental.compilation_cache import compilation_cache

    config = jax_config()
    enabled = config.jax_enable_compilation_cache
    compilation_cache.reset_cache()  # JAX decides once whether its cache is in use: ask it again
    config.update("jax_enable_compilation_cache", False)
    try:
        return build()
    finally:
        config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


BARRIER_TIMEOUT_S = 1800.0
_barriers = 0


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every process gets here, through JAX's coordination service (no device collective).

    Gloo gives up on a collective whose peers do not all reach it within 30 s, so the processes meet here
    before the first one after work whose length differs between hosts (compiling, restoring).
    A peer that dies meanwhile ends the wait by the heartbeat.
    """
    global _barriers
    if process_count() == 1:
        return
    from jax._src import distributed

    client = distributed.global_state.client
    assert client is not None
    _barriers += 1
    client.wait_at_barrier(f"respawn-{_barriers}-{name}", int(timeout_s * 1000))


def process_count() -> int:
    """1 unless JAX is in use with several processes (never imports JAX itself)."""
    jax = sys.modules.get("jax")
    return int(jax.process_count()) if jax is not None and jax.distributed.is_initialized() else 1


def is_primary() -> bool:
    jax = sys.modules.get("jax")
    return jax is None or not jax.distributed.is_initialized() or jax.process_index() == 0


def shutdown() -> None:
    """Leave the distributed runtime together: process 0 hosts the coordinator, so it must not go first."""
    if process_count() > 1:
        import jax

        jax.distributed.shutdown()


def reset() -> None:
    """Leave the distributed runtime and forget JAX's backends and whatever was compiled for their devices, so that
    configure() can join another world in this same process (a survivor of a world change re-forms in place:
    run.Run.reform). Arrays of the old backend must be dropped first; the compiled programs of the new world's size
    come from the persistent cache where it has them."""
    global _barriers
    import gc

    import jax
    from jax.extend.backend import clear_backends

    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
    gc.collect()  # the old world's arrays, before their backend goes
    clear_backends()
    jax.clear_caches()
    # Orbax keeps the signaling client of the first runtime it saw (an lru_cache): the old world's coordinator
    signaling = sys.modules.get("orbax.checkpoint._src.futures.signaling_client")
    if signaling is not None:
        signaling.get_signaling_client.cache_clear()
    _max_over_processes.clear()
    _loading.clear()
    _barriers = 0  # a new world's barriers are named from 1 on every process, joiner and survivor alike


def agree_any(flag: bool) -> bool:
    """True on every process if it is true on any: all hosts must stop (and save) at the same step."""
    return agree_max(float(flag)) > 0.0


def agree_same(value: int) -> bool:
    """True on every process if every process has the same `value` (an int from -1 to 2**24 x 4096)."""
    parts = [float(value // 4096), float(value % 4096)]  # each exact in agree_max_each's float32
    highest = agree_max_each([*parts, *(-p for p in parts)])
    return highest[:2] == [-h for h in highest[2:]]


def agree_held(value: int | None) -> int | None:
    """The value (an int from 0 to 2**24 x 4096) that every process holding one holds, on every process; None where
    no process holds one or two hold different ones. A process holding none does not count (a newcomer)."""
    a, b = (value // 4096, value % 4096) if value is not None else (-1, -1)
    never = -float(1 << 22)  # below any -a: a process holding none never sets the smallest
    highest = agree_max_each([a, b, -a if value is not None else never, -b if value is not None else never])
    if highest[0] < 0 or highest[:2] != [-h for h in highest[2:]]:
        return None
    return int(highest[0]) * 4096 + int(highest[1])


_max_over_processes: dict[int, Any] = {}  # by width: 0 for agree_max's scalar, n for agree_max_each's n values


def agree_max(value: float) -> float:
    """The largest of every process's `value` (float32), on every process: one small compiled collective."""
    if process_count() == 1:
        return value
    return float(_max_over_processes_of([value], 0)[()])


def agree_max_each(values: list[float]) -> list[float]:
    """agree_max of each of `values` (the same number on every process), in the same one collective: a world's
    processes agree in one step on whether to stop and which slices had the notice."""
    if process_count() == 1:
        return [float(v) for v in values]
    return [float(v) for v in _max_over_processes_of(values, len(values))]


def _max_over_processes_of(values: list[float], width: int) -> Any:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    per_process = NamedSharding(Mesh(devices, ("processes", "local")), P("processes"))
    shape = (jax.process_count(), width) if width else (jax.process_count(),)
    if width not in _max_over_processes:
        program = jax.jit(lambda x: x.max(axis=0), out_shardings=per_process.update(spec=P()))
        _max_over_processes[width] = compiled(program, jax.ShapeDtypeStruct(shape, np.float32, sharding=per_process))
    local = np.array([values], np.float32) if width else np.array(values, np.float32)
    return np.asarray(_max_over_processes[width](jax.make_array_from_process_local_data(per_process, local)))
