"""Which failures no other machine of the job would fix, and what the `failed` entry says of them.

A failure is permanent when the same program with the same args on the same machine type fails the same way on
every machine: a bad flag or variable (ConfigError), JAX not seeing the machine's accelerator (WrongDevices), a
program that does not compile (CompileFailed, told apart where `respawn_trainer.compiled` compiles it), the
accelerator's memory exhausted (XLA's RESOURCE_EXHAUSTED about memory, at compile time or at run time). Its entry says
`permanent` and names the cause and the fix; the program exits PERMANENT_RC (USAGE_RC for a ConfigError), so the
startup script's entry says `permanent` too, and respawn fails the job at once instead of retrying it on new
machines (docs/trainer-protocol.md, What its exit code means). Anything else is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from respawn_trainer.env import ConfigError

# The exit code of a failure no machine of the job would escape (EX_CONFIG, sysexits.h): the startup script's entry
# for it says `permanent` as the trainer's own does (docs/trainer-protocol.md, What its exit code means).
PERMANENT_RC = 78
# A bad flag or variable: argparse's exit code for a usage error, which the startup script reads as permanent too.
USAGE_RC = 2

OOM_FIX = "a smaller batch, more sharding or rematerialization, or a machine type with more accelerator memory"
COMPILE_FIX = "the program, or the args that shape it"
# XLA's status codes that say what the program asked is wrong; any other (INTERNAL, UNAVAILABLE, DEADLINE_EXCEEDED,
# ABORTED, ...) may be the machine's or the network's, and is retried.
PROGRAM_STATUSES = ("INVALID_ARGUMENT", "UNIMPLEMENTED", "NOT_FOUND", "FAILED_PRECONDITION", "OUT_OF_RANGE")
# Python's errors of a program's own making, raised while JAX traces it; I/O (OSError), memory and timeouts are not.
PROGRAM_ERRORS = (TypeError, ValueError, LookupError, AttributeError, NameError, NotImplementedError, AssertionError)


class Permanent(RuntimeError):
    """A failure every machine of the job would meet again; its message names the cause and the fix. A program
    exits PERMANENT_RC on it."""


class CompileFailed(Permanent):
    """JAX could not trace, or XLA could not compile, the program: every machine of the job compiles the same one."""


@dataclass(frozen=True)
class Failure:
    text: str  # the `failed` entry's error: one line, the cause and the fix first where permanent
    permanent: bool


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:500]


def _jax_runtime_error(e: BaseException) -> bool:
    """jax.errors.JaxRuntimeError (jaxlib's XlaRuntimeError before it), known without importing JAX."""
    return any(t.__name__ in ("JaxRuntimeError", "XlaRuntimeError") for t in type(e).__mro__)


def out_of_device_memory(e: BaseException) -> bool:
    """XLA's out-of-memory error for the accelerator's memory: at compile time (TPU: "RESOURCE_EXHAUSTED: XLA:TPU
    compile permanent error. Ran out of memory in memory space hbm") or at run time ("Out of memory while trying to
    allocate", "Error allocating device buffer"). A RESOURCE_EXHAUSTED about anything else (a gRPC message too
    large, a quota) is not one."""
    text = str(e)
    words = text.lower()
    return _jax_runtime_error(e) and text.startswith("RESOURCE_EXHAUSTED") and ("memory" in words or "allocat" in words)


def _program_error(e: BaseException) -> bool:
    """An error of the program itself while JAX traces or XLA compiles it."""
    if _jax_runtime_error(e):
        return str(e).startswith(PROGRAM_STATUSES)
    return isinstance(e, PROGRAM_ERRORS) or type(e).__module__.startswith("jax.")


T = TypeVar("T")


def compiling(build: Callable[[], T]) -> T:
    """`build()` (JAX's trace, lower and compile of one program), its program's own errors raised as CompileFailed;
    running out of device memory is left as it is (classify() names it)."""
    try:
        return build()
    except Permanent:
        raise
    except Exception as e:
        if out_of_device_memory(e) or not _program_error(e):
            raise
        raise CompileFailed(
            f"the program does not compile, on any machine of the job (fix: {COMPILE_FIX}): {one_line(e)}"
        ) from e


def classify(error: BaseException) -> Failure:
    """What the `failed` entry of `error` says, and whether another machine would do better."""
    if isinstance(error, ConfigError):
        what = "flags" if error.field in ("flag", "argument") or error.field.startswith("--") else "environment"
        fix = "the job's args" if what == "flags" else "the job's env"
        return Failure(f"the trainer rejected its {what} (fix: {fix}): {error}"[:1000], True)
    if isinstance(error, Permanent):
        return Failure(one_line(error), True)
    if out_of_device_memory(error):
        text = f"out of accelerator memory, as on any machine of this type (fix: {OOM_FIX}): {one_line(error)}"
        return Failure(text, True)
    return Failure(one_line(error), False)


def exit_code(error: BaseException) -> int:
    """The exit code of a failure: USAGE_RC for a bad flag or variable, PERMANENT_RC where no other machine of the
    job would do better, else 1."""
    if isinstance(error, ConfigError):
        return USAGE_RC
    return PERMANENT_RC if classify(error).permanent else 1
