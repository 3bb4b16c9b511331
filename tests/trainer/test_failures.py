"""Which failures respawn_trainer calls permanent (no other machine of the job would do better), and what it says.

A bad flag, a program that does not compile, the accelerator's memory exhausted: the same program and args on the
same machine type fail the same way on every machine, so the `failed` entry says `permanent`, names the cause and
the fix, and the exit code is one the startup script reads as permanent too (respawn/machine.py's PERMANENT_EXITS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from respawn import machine
from respawn_trainer import PERMANENT_RC, USAGE_RC, CompileFailed, ConfigError, Run, compiled, exit_code
from respawn_trainer.failures import classify

# XLA's own words for running out of the accelerator's memory (public reports: jax-ml/jax, LargeWorldModel/LWM #60)
DEVICE_OOMS = [
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 21.95G of "
    "15.48G hbm. Exceeded hbm capacity by 6.47G.",
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.",  # GPU, at run time
    "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.00G. That was not possible.",
]
# ... and failures another machine may well not have: retried
RETRIED = [
    jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: grpc: received message larger than max (5000 vs. 4194304)"),
    jax.errors.JaxRuntimeError("UNAVAILABLE: failed to connect to all addresses"),
    jax.errors.JaxRuntimeError("INTERNAL: Core halted unexpectedly"),
    ValueError("RESOURCE_EXHAUSTED: Error writing gs://bucket/ckpt: HTTP 429, out of memory quota"),  # not XLA's
    OSError("Connection reset by peer"),
    RuntimeError("checkpoint step 40 holds state of step 39"),
]


@pytest.mark.parametrize("text", DEVICE_OOMS)
def test_running_out_of_device_memory_is_permanent_naming_the_fix(text: str) -> None:
    error = jax.errors.JaxRuntimeError(text)
    failure = classify(error)
    assert failure.permanent and exit_code(error) == PERMANENT_RC == machine.PERMANENT_RC
    assert failure.text.startswith("out of accelerator memory") and "fix: a smaller batch" in failure.text
    assert "RESOURCE_EXHAUSTED" in failure.text and "\n" not in failure.text


@pytest.mark.parametrize("error", RETRIED, ids=lambda e: str(e)[:30])
def test_what_another_machine_may_not_meet_is_retried(error: Exception) -> None:
    assert classify(error).permanent is False and exit_code(error) == 1
    assert machine.exit_code_failure(1) == ("the trainer exited with code 1", False)  # and so says its exit code


OOM_ON_CPU = """
import resource, jax.numpy as jnp
from respawn_trainer.failures import classify, exit_code
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (8 << 30 if hard == resource.RLIM_INFINITY else min(8 << 30, hard), hard))
try:
    jnp.ones((1 << 41,), jnp.float32).block_until_ready()  # 8 TiB
except Exception as e:
    print(exit_code(e), classify(e).text)
"""


def test_jaxs_own_out_of_memory_error_is_told_apart() -> None:
    """A real one, from this JAX on CPU: 8 TiB asked of an address space of at most 8 GiB."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", OOM_ON_CPU], capture_output=True, text=True, timeout=120, env=env)
    code, _, text = proc.stdout.strip().partition(" ")
    assert code == str(PERMANENT_RC) and "RESOURCE_EXHAUSTED: Out of memory" in text, proc.stdout + proc.stderr


def _no_such_kernel(x: jax.Array) -> jax.Array:
    return jax.ffi.ffi_call("respawn_no_such_kernel", jax.ShapeDtypeStruct((), jnp.float32))(x)


def _wrong_shapes(x: jax.Array) -> jax.Array:
    return x @ jnp.ones((3, 4))


@pytest.mark.parametrize(
    ("fn", "arg", "says"),
    [
        (_wrong_shapes, jnp.ones((2, 5)), "TypeError: dot_general requires contracting dimensions"),  # in the trace
        (_no_such_kernel, jnp.float32(1), "NOT_FOUND"),  # in XLA's compile
    ],
)
def test_a_program_that_does_not_compile_is_permanent(fn: Callable[..., Any], arg: jax.Array, says: str) -> None:
    with pytest.raises(CompileFailed) as raised:
        compiled(jax.jit(fn), arg)
    failure = classify(raised.value)
    assert failure.permanent and exit_code(raised.value) == PERMANENT_RC
    assert "does not compile" in failure.text and "fix: the program" in failure.text and says in failure.text


def test_what_breaks_while_compiling_but_is_no_error_of_the_program_is_left_as_it_is() -> None:
    def reads_a_file(x: jax.Array) -> jax.Array:
        raise OSError("Connection reset by peer")  # I/O while tracing: another try may well work

    with pytest.raises(OSError):
        compiled(jax.jit(reads_a_file), jnp.float32(1))
    assert compiled(jax.jit(lambda x: x + 1), jnp.float32(1))(jnp.float32(1)) == 2


@pytest.mark.parametrize(
    ("error", "what", "fix"),
    [
        (ConfigError("flag", "--bogus is unknown", "--steps, --seed"), "flags", "fix: the job's args"),
        (ConfigError("--steps", "-1 is below 1", "1..1e9"), "flags", "fix: the job's args"),
        (ConfigError("RESPAWN_PROGRESS_S", "soon", "seconds"), "environment", "fix: the job's env"),
    ],
)
def test_a_bad_flag_or_variable_is_permanent_with_the_usage_exit_code(error: ConfigError, what: str, fix: str) -> None:
    failure = classify(error)
    assert failure.permanent and failure.text.startswith(f"the trainer rejected its {what} ({fix})")
    assert str(error) in failure.text
    assert exit_code(error) == USAGE_RC and machine.exit_code_failure(USAGE_RC)[1] is True  # the script's entry too


def test_the_failed_entry_of_a_run_says_permanent_with_the_cause(tmp_path: Path) -> None:
    """Inside `with Run(...)`: the entry before the exit, `permanent` only where another machine would not help."""
    sink = tmp_path / "entries"
    env = {"RESPAWN_JOB_ID": "j", "RESPAWN_CHECKPOINT_URI": str(tmp_path), "RESPAWN_LOG_SINK": str(sink)}
    for error in (jax.errors.JaxRuntimeError(DEVICE_OOMS[1]), OSError("Connection reset by peer")):
        with pytest.raises(type(error)), Run(3, checkpointer=_Nothing(), env=env, use_jax=False):
            raise error
    entries = [json.loads(line) for line in sink.read_text().splitlines()]
    failed = [(e.get("permanent", False), e["error"]) for e in entries if e["event"] == "failed"]
    assert [p for p, _ in failed] == [True, False], failed
    assert failed[0][1].startswith("out of accelerator memory") and failed[1][1] == "OSError: Connection reset by peer"


class _Nothing:
    def restore_newest(self, template: object, agree_any: object) -> None:
        return None

    def wait(self) -> list[object]:
        return []

    def close(self) -> None:
        pass
