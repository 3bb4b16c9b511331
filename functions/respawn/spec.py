"""The job message (SPEC 3.1): strict validation into a JobSpec or a CancelRequest.

Every error is a SpecError whose str() is one line naming the field, what was
wrong and what is allowed. Values are quoted JSON-style (so a hostile value can
never break the line) and cut short; env values are never echoed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from respawn.model import GpuMachine, JobSpec, MachineSpec, Tier, TpuMachine
from respawn.topology import UnknownTpuType, tpu_topology

MAX_MESSAGE_BYTES = 256 * 1024
TTL_MIN_S = 60
TTL_MAX_S = 14 * 24 * 3600
HANG_TIMEOUT_MIN_S = 120
DEFAULT_HANG_TIMEOUT = "30m"

JOB_ID_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,37}[a-z0-9])?$")  # ^[a-z][a-z0-9-]{0,38}$, not ending in "-"
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
TPU_TYPE_RE = re.compile(r"^v[0-9]+[a-z]*(?:-[a-z]+)?-[1-9][0-9]{0,4}$")
RUNTIME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
GPU_TYPE_RE = re.compile(r"^nvidia-[a-z0-9-]+$")
ENV_KEY_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# A Secret Manager secret version: projects/PROJECT (id or number)/secrets/SECRET_ID/versions/(N | latest).
SECRET_REF_RE = re.compile(
    r"^projects/(?:[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,20})/secrets/[A-Za-z0-9_-]{1,255}/versions/(?:[1-9][0-9]{0,9}|latest)$"
)
SECRET_REF_ALLOWED = "projects/PROJECT/secrets/SECRET_ID/versions/VERSION, VERSION a number or latest"
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
TTL_RE = re.compile(r"^([0-9]{1,8})([smhd])$")
GS_URI_RE = re.compile(r"^gs://([^/]*)/(.*)$")
OBJECT_PATH_RE = re.compile(r"^[A-Za-z0-9._~=+@,-]+(?:/[A-Za-z0-9._~=+@,-]+)*/?$")
BUCKET_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{1,220}[a-z0-9])$")
IPV4_RE = re.compile(r"^[0-9]{1,3}(?:\.[0-9]{1,3}){3}$")
# An OCI image reference: [host[:port]/]path[:tag][@digest]; lowercase path components.
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})"
_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})"
IMAGE_RE = re.compile(rf"^{_HOST}?{_PATH}{_TAG}?{_DIGEST}?$")

PROVISIONING = ("spot", "preemptible", "standard")
TIER_PROVISIONING = (*PROVISIONING, "reservation")
REQUESTS = ("queued", "node")
MAX_TIERS = 5
RESERVATION_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$")
DEFAULT_QUEUE_TIMEOUT = "30m"
DEFAULT_REQUEST = "queued"
GPU_COUNTS = (1, 2, 4, 8, 16)
MAX_ZONES = 20
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
MAX_ENV_BYTES = 32 * 1024
MAX_SECRETS = 64
MAX_LABELS = 60
MAX_IMAGE_CHARS = 512
MAX_URI_CHARS = 1024
MAX_PREEMPTIONS = 1_000_000
MAX_FAILURES = 100
BOOT_DISK_GB = (10, 65536)
RESERVED_ENV_PREFIX = "RESPAWN_"
RESERVED_LABEL_PREFIX = "respawn-"

SUBMIT_FIELDS = (
    "action",
    "job_id",
    "machine",
    "zones",
    "provisioning",
    "image",
    "args",
    "env",
    "secrets",
    "checkpoint_uri",
    "ttl",
    "max_preemptions",
    "max_failures",
    "labels",
    "hang_timeout",
    "tiers",
)
REQUIRED_FIELDS = ("job_id", "machine", "image", "checkpoint_uri")
CANCEL_FIELDS = ("action", "job_id")
TPU_FIELDS = ("kind", "accelerator_type", "runtime_version", "request", "queue_timeout")
TIER_FIELDS = ("provisioning", "zones", "reservation", "move_on")
MOVE_ON_FIELDS = ("after_preemptions", "after_stockout", "deadline_within")
GPU_FIELDS = ("kind", "machine_type", "accelerator_type", "accelerator_count", "boot_disk_gb")
DEFAULT_TTL = "48h"


class SpecError(ValueError):
    """An invalid job message. str(e) is one line: the field, what was wrong, what is allowed."""

    def __init__(self, field: str, problem: str, allowed: str) -> None:
        self.field = field
        self.problem = problem
        self.allowed = allowed
        where = f'field "{field}": ' if field else ""
        super().__init__(f"job message: {where}{problem}; allowed: {allowed}")


@dataclass(frozen=True)
class CancelRequest:
    job_id: str


def _fail(field: str, problem: str, allowed: str) -> NoReturn:
    raise SpecError(field, problem, allowed)


def show(value: Any, limit: int = 60) -> str:
    """A value as one short, safe line (JSON quoting escapes newlines and quotes)."""
    try:
        text = json.dumps(value, ensure_ascii=True, default=str)
    except (ValueError, TypeError):  # e.g. a recursive structure
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str, limit: int = 80) -> str:
    """Text escaped onto one line (no quotes added) and cut short."""
    escaped = json.dumps(text, ensure_ascii=True)[1:-1]
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def _key(name: Any) -> str:
    """A field name as it appears in an error (escaped, short; an empty name is shown as <empty>)."""
    return one_line(str(name), 40) or "<empty>"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    for typ, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, typ):
            return name
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _expect_type(field: str, value: Any, typ: type, name: str) -> None:
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if not ok:
        _fail(field, f"expected {name}, got {_type_name(value)}", name)


def _string(field: str, value: Any, regex: re.Pattern[str], allowed: str, what: str) -> str:
    _expect_type(field, value, str, "a string")
    if not regex.fullmatch(value):
        _fail(field, f"{show(value)} is not {what}", allowed)
    return str(value)


def _int(field: str, value: Any, lo: int, hi: int) -> int:
    _expect_type(field, value, int, "an integer")
    if not lo <= value <= hi:
        _fail(field, f"{show(value)} is out of range", f"an integer from {lo} to {hi}")
    return int(value)


def _only(field: str, obj: dict[Any, Any], allowed: tuple[str, ...]) -> None:
    for k in obj:
        if k not in allowed:
            path = f"{field}.{_key(k)}" if field else _key(k)
            _fail(path, "unknown field", ", ".join(allowed))


# ---------------------------------------------------------------------------- fields


def _job_id(value: Any) -> str:
    return _string(
        "job_id",
        value,
        JOB_ID_RE,
        "1-39 characters: lowercase letters, digits and '-', starting with a letter, not ending with '-'",
        "a valid job id",
    )


def _machine(value: Any) -> MachineSpec:
    _expect_type("machine", value, dict, "an object")
    kind = value.get("kind")
    if kind == "tpu":
        _only("machine", value, TPU_FIELDS)
        for f in TPU_FIELDS[1:3]:
            if f not in value:
                _fail(f"machine.{f}", "missing", "required for kind tpu")
        accelerator_type = _string(
            "machine.accelerator_type",
            value["accelerator_type"],
            TPU_TYPE_RE,
            "a Cloud TPU type like v5litepod-8, v4-8, v6e-8, v5p-16",
            "a TPU accelerator type",
        )
        try:
            tpu_topology(accelerator_type)
        except UnknownTpuType as e:
            problem, _, allowed = str(e).partition("; allowed: ")
            _fail("machine.accelerator_type", problem, allowed)
        request = value.get("request", DEFAULT_REQUEST)
        if request not in REQUESTS:
            _fail("machine.request", f"{show(request)} is not a request mode", '"queued" (a queued resource) or "node"')
        queue_timeout = value.get("queue_timeout", DEFAULT_QUEUE_TIMEOUT)
        if request != "queued" and "queue_timeout" in value:
            _fail("machine.queue_timeout", "only a queued request waits in a queue", 'request "queued"')
        return TpuMachine(
            request=str(request),
            queue_timeout_s=parse_ttl(queue_timeout, "machine.queue_timeout"),
            accelerator_type=accelerator_type,
            runtime_version=_string(
                "machine.runtime_version",
                value["runtime_version"],
                RUNTIME_RE,
                "a TPU runtime version like v2-alpha-tpuv5-lite or tpu-ubuntu2204-base",
                "a TPU runtime version",
            ),
        )
    if kind == "gpu":
        _only("machine", value, GPU_FIELDS)
        for f in GPU_FIELDS[1:4]:
            if f not in value:
                _fail(f"machine.{f}", "missing", "required for kind gpu")
        count = value["accelerator_count"]
        _expect_type("machine.accelerator_count", count, int, "an integer")
        if count not in GPU_COUNTS:
            _fail("machine.accelerator_count", f"{show(count)} is not a GPU count", "one of 1, 2, 4, 8, 16")
        return GpuMachine(
            machine_type=_string(
                "machine.machine_type",
                value["machine_type"],
                MACHINE_TYPE_RE,
                "a Compute Engine machine type like g2-standard-8 or a2-highgpu-1g",
                "a machine type",
            ),
            accelerator_type=_string(
                "machine.accelerator_type",
                value["accelerator_type"],
                GPU_TYPE_RE,
                "a GPU type like nvidia-l4, nvidia-tesla-a100, nvidia-h100-80gb",
                "a GPU accelerator type",
            ),
            accelerator_count=count,
            boot_disk_gb=_int("machine.boot_disk_gb", value.get("boot_disk_gb", 200), *BOOT_DISK_GB),
        )
    if "kind" not in value:
        _fail("machine.kind", "missing", '"tpu" or "gpu"')
    _fail("machine.kind", f"{show(kind)} is not a machine kind", '"tpu" or "gpu"')


def _zones(value: Any, field: str = "zones") -> tuple[str, ...]:
    _expect_type(field, value, list, "a list of zones")
    if not value:
        _fail(field, "the list is empty", "1 to 20 zone names like us-central1-a, in order of preference")
    if len(value) > MAX_ZONES:
        _fail(field, f"{len(value)} zones", f"at most {MAX_ZONES} zones")
    zones: list[str] = []
    for i, z in enumerate(value):
        zone = _string(f"{field}[{i}]", z, ZONE_RE, "a zone name like us-central1-a", "a zone")
        if zone in zones:
            _fail(f"{field}[{i}]", f"{show(zone)} is listed twice", "each zone once")
        zones.append(zone)
    return tuple(zones)


def _tiers(value: Any) -> tuple[Tier, ...]:
    """Ordered ways of getting machines: [{provisioning, zones, reservation?, move_on?}, ...]."""
    _expect_type("tiers", value, list, "a list of tiers")
    if not 1 <= len(value) <= MAX_TIERS:
        _fail("tiers", f"{len(value)} tiers", f"1 to {MAX_TIERS} tiers, in the order to try them")
    tiers = []
    for i, t in enumerate(value):
        field = f"tiers[{i}]"
        _expect_type(field, t, dict, "an object")
        _only(field, t, TIER_FIELDS)
        for f in ("provisioning", "zones"):
            if f not in t:
                _fail(f"{field}.{f}", "missing", "required in every tier")
        provisioning = t["provisioning"]
        _expect_type(f"{field}.provisioning", provisioning, str, "a string")
        if provisioning not in TIER_PROVISIONING:
            _fail(
                f"{field}.provisioning",
                f"{show(provisioning)} is not a provisioning model",
                ", ".join(TIER_PROVISIONING),
            )
        reservation = t.get("reservation")
        if provisioning == "reservation":
            if reservation is None:
                _fail(f"{field}.reservation", "missing", "the name of a reservation in the tier's zones")
            _string(
                f"{field}.reservation",
                reservation,
                RESERVATION_RE,
                "a reservation name like tpu-res-1",
                "a reservation name",
            )
        elif reservation is not None:
            _fail(f"{field}.reservation", "only a reservation tier names a reservation", 'provisioning "reservation"')
        move_on = t.get("move_on", {})
        _expect_type(f"{field}.move_on", move_on, dict, "an object")
        _only(f"{field}.move_on", move_on, MOVE_ON_FIELDS)
        if move_on and i == len(value) - 1:
            _fail(f"{field}.move_on", "the last tier has no tier to move on to", "move_on on any tier but the last")
        if i < len(value) - 1 and not move_on:
            _fail(f"{field}.move_on", "missing: this tier would never move on", ", ".join(MOVE_ON_FIELDS))
        after = move_on.get("after_preemptions")
        tiers.append(
            Tier(
                provisioning=provisioning,
                zones=_zones(t["zones"], f"{field}.zones"),
                reservation=reservation,
                after_preemptions=None
                if after is None
                else _int(f"{field}.move_on.after_preemptions", after, 1, 10_000),
                after_stockout_s=_duration_or_none(move_on.get("after_stockout"), f"{field}.move_on.after_stockout"),
                deadline_within_s=_duration_or_none(move_on.get("deadline_within"), f"{field}.move_on.deadline_within"),
            )
        )
    return tuple(tiers)


def _duration_or_none(value: Any, field: str) -> int | None:
    return None if value is None else parse_ttl(value, field)


def _provisioning(value: Any) -> str:
    _expect_type("provisioning", value, str, "a string")
    if value not in PROVISIONING:
        _fail("provisioning", f"{show(value)} is not a provisioning model", "spot, preemptible, standard")
    return str(value)


def _image(value: Any) -> str:
    _expect_type("image", value, str, "a string")
    if len(value) > MAX_IMAGE_CHARS:
        _fail("image", f"{len(value)} characters", f"at most {MAX_IMAGE_CHARS} characters")
    if not IMAGE_RE.fullmatch(value):
        _fail(
            "image",
            f"{show(value)} is not a container image reference",
            "HOST/PATH[:TAG][@sha256:DIGEST] like us-docker.pkg.dev/my-project/repo/trainer:v1",
        )
    return str(value)


def _args(value: Any) -> tuple[str, ...]:
    _expect_type("args", value, list, "a list of strings")
    if len(value) > MAX_ARGS:
        _fail("args", f"{len(value)} items", f"at most {MAX_ARGS} items")
    for i, a in enumerate(value):
        _expect_type(f"args[{i}]", a, str, "a string")
        if len(a) > MAX_ARG_CHARS:
            _fail(f"args[{i}]", f"{len(a)} characters", f"at most {MAX_ARG_CHARS} characters")
        if "\x00" in a:
            _fail(f"args[{i}]", "contains a NUL character", "any text without NUL")
    return tuple(value)


def _variable_name(field: str, name: Any) -> None:
    """A name of the trainer's environment (the keys of `env` and `secrets`)."""
    if not isinstance(name, str) or not ENV_KEY_RE.fullmatch(name):
        _fail(field, "not a valid variable name", "names of uppercase letters, digits and _, not starting with a digit")
    if name.startswith(RESERVED_ENV_PREFIX):
        _fail(field, f"names starting with {RESERVED_ENV_PREFIX} are reserved", "any other name")


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    _expect_type("env", value, dict, "an object")
    total = 0
    for k, v in value.items():
        field = f"env.{_key(k)}"
        _variable_name(field, k)
        _expect_type(field, v, str, "a string")  # a type name only: values are never echoed
        if "\x00" in v:
            _fail(field, "the value contains a NUL character", "any text without NUL")
        total += len(k.encode()) + len(v.encode("utf-8", "surrogatepass"))
    if total > MAX_ENV_BYTES:
        _fail("env", f"{total} bytes of names and values", f"at most {MAX_ENV_BYTES} bytes")
    return tuple(sorted(value.items()))


def _secrets(value: Any) -> tuple[tuple[str, str], ...]:
    """{VARIABLE: Secret Manager version reference}: references only, resolved on the machine by its account."""
    _expect_type("secrets", value, dict, "an object")
    if len(value) > MAX_SECRETS:
        _fail("secrets", f"{len(value)} secrets", f"at most {MAX_SECRETS} secrets")
    for k, v in value.items():
        field = f"secrets.{_key(k)}"
        _variable_name(field, k)
        _string(field, v, SECRET_REF_RE, SECRET_REF_ALLOWED, "a Secret Manager secret version")
    return tuple(sorted(value.items()))


def _checkpoint_uri(value: Any) -> str:
    allowed = "gs://BUCKET/PATH with a valid bucket name and a path of letters, digits and ._~=+@,-/"
    _expect_type("checkpoint_uri", value, str, "a string")
    if len(value) > MAX_URI_CHARS:
        _fail("checkpoint_uri", f"{len(value)} characters", f"at most {MAX_URI_CHARS} characters")
    m = GS_URI_RE.fullmatch(value)
    if not m:
        _fail("checkpoint_uri", f"{show(value)} is not a gs:// URI with a path", allowed)
    bucket, path = m.group(1), m.group(2)
    if not _valid_bucket(bucket):
        _fail("checkpoint_uri", f"{show(bucket)} is not a valid bucket name", allowed)
    if not OBJECT_PATH_RE.fullmatch(path) or any(part in (".", "..") for part in path.split("/")):
        _fail("checkpoint_uri", f"{show(path)} is not a valid object path", allowed)
    return str(value)


def _valid_bucket(name: str) -> bool:
    """Cloud Storage bucket naming rules (the ones a URI can break)."""
    if not BUCKET_RE.fullmatch(name) or IPV4_RE.fullmatch(name) or name.startswith("goog") or "google" in name:
        return False
    if "." not in name:
        return len(name) <= 63
    return all(0 < len(part) <= 63 for part in name.split("."))


def parse_ttl(value: Any, field: str = "ttl", lo: int = TTL_MIN_S) -> int:
    """A TTL ("90s", "30m", "48h", "2d" or integer seconds) -> seconds, within lo (default 60 s) .. 14 d."""
    allowed = f"a duration like 90s, 30m, 48h, 2d or integer seconds, from {format_ttl(lo)} to 14d"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        _fail(field, f"expected a duration string or an integer, got {_type_name(value)}", allowed)
    if isinstance(value, str):
        m = TTL_RE.fullmatch(value)
        if not m:
            _fail(field, f"{show(value)} is not a duration", allowed)
        seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    else:
        seconds = value
    if not lo <= seconds <= TTL_MAX_S:
        _fail(field, f"{show(value)} is out of range", allowed)
    return int(seconds)


def format_ttl(seconds: int) -> str:
    """The inverse of parse_ttl: the largest whole unit ("2d", "90m", "45s")."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _hang_timeout(value: Any) -> int | None:
    """`off` (or null) -> None (no hang detection); else a duration from 2m to 14d."""
    if value is None or value == "off":
        return None
    if isinstance(value, str) and not TTL_RE.fullmatch(value):
        _fail("hang_timeout", f"{show(value)} is not a duration", "off, or a duration from 2m to 14d like 30m")
    return parse_ttl(value, "hang_timeout", HANG_TIMEOUT_MIN_S)


def _max_preemptions(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(
            "max_preemptions", f"expected null or an integer, got {_type_name(value)}", "null (unlimited) or 0 or more"
        )
    if not 0 <= value <= MAX_PREEMPTIONS:
        _fail("max_preemptions", f"{show(value)} is out of range", f"null (unlimited) or 0 to {MAX_PREEMPTIONS}")
    return value


def _labels(value: Any) -> tuple[tuple[str, str], ...]:
    _expect_type("labels", value, dict, "an object")
    if len(value) > MAX_LABELS:
        _fail("labels", f"{len(value)} labels", f"at most {MAX_LABELS} labels")
    for k, v in value.items():
        field = f"labels.{_key(k)}"
        if not isinstance(k, str) or not LABEL_KEY_RE.fullmatch(k):
            _fail(field, "not a valid label key", "1-63 lowercase letters, digits, _ and -, starting with a letter")
        if k.startswith(RESERVED_LABEL_PREFIX):
            _fail(field, f"keys starting with {RESERVED_LABEL_PREFIX} are reserved", "any other key")
        _string(field, v, LABEL_VALUE_RE, "0-63 lowercase letters, digits, _ and -", "a valid label value")
    return tuple(sorted(value.items()))


# ---------------------------------------------------------------------------- messages


def _decode(data: bytes | str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(data, dict):
        try:
            size = len(json.dumps(data, default=str).encode("utf-8", "surrogatepass"))
        except (ValueError, TypeError, RecursionError):
            _fail("", "the message cannot be represented as JSON", "a JSON object")
        obj: Any = data
    elif isinstance(data, (bytes, str)):
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        size = len(raw)
        if size > MAX_MESSAGE_BYTES:
            _fail("", f"the message is {size} bytes", f"at most {MAX_MESSAGE_BYTES} bytes")
        try:
            obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        except UnicodeDecodeError:
            _fail("", "the message is not UTF-8 text", "a JSON object in UTF-8")
        except _DuplicateField as e:
            _fail(_key(e.args[0]), "the field appears twice", "each field once")
        except (ValueError, RecursionError) as e:
            _fail("", f"the message is not valid JSON ({one_line(str(e))})", "a JSON object")
    else:
        _fail("", f"expected JSON text or an object, got {_type_name(data)}", "a JSON object")
    if size > MAX_MESSAGE_BYTES:
        _fail("", f"the message is {size} bytes", f"at most {MAX_MESSAGE_BYTES} bytes")
    if not isinstance(obj, dict):
        _fail("", f"expected a JSON object, got {_type_name(obj)}", "a JSON object")
    try:
        bad = _unencodable(obj, "")
    except RecursionError:
        _fail("", "the message is nested too deeply", "a JSON object")
    if bad is not None:
        _fail(bad, "contains a character that is not valid Unicode (a lone surrogate)", "valid Unicode text")
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
        sub = f"{path}[{k}]" if isinstance(k, int) else f"{path}.{_key(k)}" if path else _key(k)
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


def parse_job_message(data: bytes | str | dict[str, Any]) -> JobSpec | CancelRequest:
    """A job message (JSON bytes/str or a decoded object) -> JobSpec (submit) or CancelRequest (cancel).

    Raises SpecError (one line: field, problem, what is allowed) on anything invalid, and nothing else.
    """
    obj = _decode(data)
    if "action" not in obj:
        _fail("action", "missing", '"submit" or "cancel"')
    action = obj["action"]
    if action == "cancel":
        for k in obj:
            if k not in CANCEL_FIELDS:
                problem = 'not allowed with action "cancel"' if k in SUBMIT_FIELDS else "unknown field"
                _fail(_key(k), problem, ", ".join(CANCEL_FIELDS))
        if "job_id" not in obj:
            _fail("job_id", "missing", "the id of the job to cancel")
        return CancelRequest(job_id=_job_id(obj["job_id"]))
    if action != "submit":
        _fail("action", f"{show(action)} is not an action", '"submit" or "cancel"')
    _only("", obj, SUBMIT_FIELDS)
    for f in REQUIRED_FIELDS:
        if f not in obj:
            _fail(f, "missing", "required for action submit")
    tiers = _tiers(obj["tiers"]) if "tiers" in obj else ()
    for f in ("zones", "provisioning"):
        if tiers and f in obj:
            _fail(f, "not allowed with tiers", f"{f} inside each tier")
    if not tiers and "zones" not in obj:
        _fail("zones", "missing", "required for action submit (or tiers, each with its zones)")
    fields: dict[str, Callable[[Any], Any]] = {
        "job_id": _job_id,
        "machine": _machine,
        "zones": _zones,
        "provisioning": _provisioning,
        "image": _image,
        "args": _args,
        "env": _env,
        "secrets": _secrets,
        "checkpoint_uri": _checkpoint_uri,
        "ttl": parse_ttl,
        "max_preemptions": _max_preemptions,
        "max_failures": lambda v: _int("max_failures", v, 0, MAX_FAILURES),
        "labels": _labels,
        "hang_timeout": _hang_timeout,
        "tiers": lambda t: tiers,
    }
    defaults: dict[str, Any] = {
        "provisioning": "spot",
        "args": [],
        "env": {},
        "secrets": {},
        "ttl": DEFAULT_TTL,
        "max_preemptions": None,
        "max_failures": 3,
        "labels": {},
        "hang_timeout": DEFAULT_HANG_TIMEOUT,
    }
    if tiers:  # tier 0 is also the job's zones and provisioning (what the first attempt uses)
        obj = {**obj, "zones": list(tiers[0].zones)}
    v = {name: check(obj.get(name, defaults.get(name))) for name, check in fields.items()}
    for name in sorted(dict(v["secrets"]).keys() & dict(v["env"]).keys()):
        _fail(f"secrets.{name}", "the variable is also set in env", "each variable in env or in secrets, not both")
    return JobSpec(
        job_id=v["job_id"],
        machine=v["machine"],
        zones=v["zones"],
        image=v["image"],
        checkpoint_uri=v["checkpoint_uri"],
        provisioning=tiers[0].provisioning if tiers else v["provisioning"],
        args=v["args"],
        env=v["env"],
        secrets=v["secrets"],
        ttl_s=v["ttl"],
        max_preemptions=v["max_preemptions"],
        max_failures=v["max_failures"],
        labels=v["labels"],
        hang_timeout_s=v["hang_timeout"],
        tiers=v["tiers"],
    )


def spec_to_message(spec: JobSpec) -> dict[str, Any]:
    """The submit message for a JobSpec: parse_job_message(spec_to_message(s)) == s."""
    m = spec.machine
    machine: dict[str, Any] = (
        {
            "kind": "tpu",
            "accelerator_type": m.accelerator_type,
            "runtime_version": m.runtime_version,
            "request": m.request,
            **({"queue_timeout": format_ttl(m.queue_timeout_s)} if m.request == "queued" else {}),
        }
        if isinstance(m, TpuMachine)
        else {
            "kind": "gpu",
            "machine_type": m.machine_type,
            "accelerator_type": m.accelerator_type,
            "accelerator_count": m.accelerator_count,
            "boot_disk_gb": m.boot_disk_gb,
        }
    )
    where: dict[str, Any] = (
        {"tiers": [_tier_message(t) for t in spec.tiers]}
        if spec.tiers
        else {"zones": list(spec.zones), "provisioning": spec.provisioning}
    )
    return {
        "action": "submit",
        "job_id": spec.job_id,
        "machine": machine,
        **where,
        "image": spec.image,
        "args": list(spec.args),
        "env": dict(spec.env),
        **({"secrets": dict(spec.secrets)} if spec.secrets else {}),
        "checkpoint_uri": spec.checkpoint_uri,
        "ttl": format_ttl(spec.ttl_s),
        "max_preemptions": spec.max_preemptions,
        "max_failures": spec.max_failures,
        "labels": dict(spec.labels),
        "hang_timeout": "off" if spec.hang_timeout_s is None else format_ttl(spec.hang_timeout_s),
    }


def _tier_message(tier: Tier) -> dict[str, Any]:
    rules = {
        "after_preemptions": tier.after_preemptions,
        "after_stockout": None if tier.after_stockout_s is None else format_ttl(tier.after_stockout_s),
        "deadline_within": None if tier.deadline_within_s is None else format_ttl(tier.deadline_within_s),
    }
    move_on = {k: v for k, v in rules.items() if v is not None}
    return {
        "provisioning": tier.provisioning,
        "zones": list(tier.zones),
        **({"reservation": tier.reservation} if tier.reservation else {}),
        **({"move_on": move_on} if move_on else {}),
    }


def cancel_message(job_id: str) -> dict[str, Any]:
    """The cancel message for a job (validated)."""
    return {"action": "cancel", "job_id": _job_id(job_id)}


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
            _fail("", f"{p} is {size} bytes", f"at most {MAX_MESSAGE_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        _fail("", f"{p} is not UTF-8 text", allowed)
    except OSError as e:
        _fail("", f"cannot read {p}: {e.strerror or e}", allowed)
    try:
        if p.suffix.lower() == ".json":
            obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        else:
            obj = yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass: no arbitrary objects
    except _DuplicateField as e:
        _fail(_key(e.args[0]), f"the field appears twice in {p}", "each field once")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        what = getattr(e, "problem", None) or type(e).__name__
        _fail("", f"{p} is not valid YAML{where}: {one_line(str(what))}", allowed)
    except (ValueError, RecursionError) as e:
        kind = "JSON" if p.suffix.lower() == ".json" else "YAML"
        _fail("", f"{p} is not valid {kind}: {one_line(str(e))}", allowed)
    if not isinstance(obj, dict):
        _fail("", f"{p} holds {_type_name(obj)}, not an object", allowed)
    return obj
