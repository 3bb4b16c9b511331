"""The job message (SPEC 3.1): strict validation into a JobSpec or a CancelRequest.

Every error is a SpecError whose str() is one line naming the field, what was
wrong and what is allowed. Values are quoted JSON-style (so a hostile value can
never break the line) and cut short; env values are never echoed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from respawn.model import API_COMPUTE, API_TPU, FLEX_START_MAX_RUN_S, GpuMachine, JobSpec, MachineSpec, Tier, TpuMachine
from respawn.topology import COMPUTE_GENERATIONS, COMPUTE_OFFERS, TPU_API_GENERATIONS, UnknownTpuType, tpu_topology

MAX_MESSAGE_BYTES = 256 * 1024
TTL_MIN_S = 60
TTL_MAX_S = 14 * 24 * 3600
HANG_TIMEOUT_MIN_S = 120

JOB_ID_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,37}[a-z0-9])?$")  # ^[a-z][a-z0-9-]{0,38}$, not ending in "-"
# A Compute Engine zone: REGION-X (us-central1-a), or an AI zone REGION-aiNX (us-central1-ai1a, whose parent zone is
# us-central1-a), where Google offers TPUs and GPUs: https://cloud.google.com/compute/docs/regions-zones/ai-zones
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-(?:ai[0-9]+)?[a-z]$")
ENV_KEY_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# A Secret Manager secret version: projects/PROJECT (id or number)/secrets/SECRET_ID/versions/(N | latest).
SECRET_REF_RE = re.compile(
    r"^projects/(?:[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,20})/secrets/[A-Za-z0-9_-]{1,255}/versions/(?:[1-9][0-9]{0,9}|latest)$"
)
SECRET_REF_ALLOWED = "projects/PROJECT/secrets/SECRET_ID/versions/VERSION, VERSION a number or latest"
TTL_RE = re.compile(r"^([0-9]{1,8})([smhd])$")
TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest Spot VM metadata notice respawn asks for: Google documents none (preview), so a bound of respawn's
PREEMPTION_NOTICE_MAX_S = 3600
# An OCI image reference: [host[:port]/]path[:tag][@digest]; lowercase path components.
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})"
_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})"
IMAGE_RE = re.compile(rf"^{_HOST}?{_PATH}{_TAG}?{_DIGEST}?$")

FLEX_START = "flex-start"  # Compute Engine's queue for capacity: a GPU, or a TPU with machine.api compute
PROVISIONING = ("spot", "preemptible", "standard", FLEX_START)
TIER_PROVISIONING = (*PROVISIONING, "reservation")
SPOT_PROVISIONING = ("spot", "preemptible")  # the tiers a fallback tier goes back to (back_to_spot_after)
# ranked: each attempt's zone by the outlook (history, advice, price); ordered: the list's order, the same zone again
PLACEMENTS = ("ranked", "ordered")
REQUESTS = ("queued", "node")
APIS = (API_COMPUTE, API_TPU)
# Compute Engine's requestValidForDuration, how long an instance insert waits for flex-start capacity, is at most
# 2 hours: "must be at least 90 and less or equal to 7200 seconds" is the API's own error as users report it; no
# Google page states the range, so a flex-start job's queue_timeout stays inside it.
FLEX_START_QUEUE_MAX_S = 2 * 3600
# A slice's MIG names its VMs JOB-aN-w-x7k2: a job id ending in -aN-w could name an instance the same way.
SLICE_VM_LIKE_RE = re.compile(r"-a[1-9][0-9]*-w$")
# A boot image or image family: projects/PROJECT/global/images/(family/)NAME, optionally as a full API URL.
BOOT_IMAGE_RE = re.compile(
    r"^(?:https://(?:www|compute)\.googleapis\.com/compute/v1/)?"
    r"projects/[a-z][a-z0-9-]{4,61}[a-z0-9]/global/images/(?:family/)?[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$"
)
MAX_TIERS = 5
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

Parse = Callable[[Any, str], Any]  # (a field's value, its path in the message: `tiers[1].zones`) -> the model's value


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


# ---------------------------------------------------------------------------- one field's value
# Each parser takes the value and its path in the message (`tiers[1].zones`) and returns the model's value.


def _matching(regex: re.Pattern[str], allowed: str, what: str) -> Parse:
    """A parser of a string that must match regex: `"x" is not <what>; allowed: <allowed>`."""
    return lambda value, path: _string(path, value, regex, allowed, what)


def _within(lo: int, hi: int) -> Parse:
    """A parser of an integer from lo to hi."""
    return lambda value, path: _int(path, value, lo, hi)


def _one_of(options: tuple[str, ...], what: str) -> Parse:
    """A parser of a string that must be one of options."""

    def parse(value: Any, path: str) -> str:
        _expect_type(path, value, str, "a string")
        if value not in options:
            _fail(path, f"{show(value)} is not {what}", ", ".join(options))
        return str(value)

    return parse


def _boolean(value: Any, path: str) -> bool:
    _expect_type(path, value, bool, "true or false")
    return bool(value)


def _optional(parse: Parse) -> Parse:
    """A parser that also takes null, as None."""
    return lambda value, path: None if value is None else parse(value, path)


def _job_id(value: Any, path: str) -> str:
    job_id = _string(
        path,
        value,
        JOB_ID_RE,
        "1-39 characters: lowercase letters, digits and '-', starting with a letter, not ending with '-'",
        "a valid job id",
    )
    if SLICE_VM_LIKE_RE.search(job_id):
        _fail(path, f"{show(job_id)} ends like a slice's VM names (JOB-aN-w-x7k2)", "a job id not ending in -aN-w")
    return job_id


def _tpu_type(value: Any, path: str) -> str:
    """A TPU accelerator type of a size Cloud TPU has (topology.py's table)."""
    accelerator_type = _string(
        path,
        value,
        re.compile(r"^(?:v|tpu)[0-9]+[a-z]*(?:-[a-z]+)?-[1-9][0-9]{0,4}$"),
        "a TPU type like v5litepod-8, v4-8, v6e-8, v5p-16, tpu7x-8",
        "a TPU accelerator type",
    )
    try:
        tpu_topology(accelerator_type)
    except UnknownTpuType as e:
        problem, _, allowed = str(e).partition("; allowed: ")
        _fail(path, problem, allowed)
    return accelerator_type


def _boot_image(value: Any, path: str) -> str:
    return _string(
        path,
        value,
        BOOT_IMAGE_RE,
        "projects/PROJECT/global/images/family/FAMILY or projects/PROJECT/global/images/IMAGE",
        "a boot image or image family",
    )


def _max_run_duration(value: Any, path: str) -> int:
    """A flex-start machine's run time: a duration from 1 minute to Compute Engine's 7 days."""
    seconds = parse_ttl(value, path)
    if seconds > FLEX_START_MAX_RUN_S:
        _fail(path, f"{show(value)} is out of range", "a duration like 90m, 48h or 7d, from 1m to 7d")
    return seconds


def _request(value: Any, path: str) -> str:
    if value not in REQUESTS:
        _fail(path, f"{show(value)} is not a request mode", '"queued" (a queued resource) or "node"')
    return str(value)


def _gpu_count(value: Any, path: str) -> int:
    _expect_type(path, value, int, "an integer")
    if value not in GPU_COUNTS:
        _fail(path, f"{show(value)} is not a GPU count", "one of " + ", ".join(str(n) for n in GPU_COUNTS))
    return int(value)


def _zones(value: Any, path: str) -> tuple[str, ...]:
    _expect_type(path, value, list, "a list of zones")
    if not value:
        _fail(path, "the list is empty", "1 to 20 zone names like us-central1-a, in order of preference")
    if len(value) > MAX_ZONES:
        _fail(path, f"{len(value)} zones", f"at most {MAX_ZONES} zones")
    zones: list[str] = []
    for i, z in enumerate(value):
        zone = _string(f"{path}[{i}]", z, ZONE_RE, "a zone name like us-central1-a", "a zone")
        if zone in zones:
            _fail(f"{path}[{i}]", f"{show(zone)} is listed twice", "each zone once")
        zones.append(zone)
    return tuple(zones)


def _image(value: Any, path: str) -> str:
    _expect_type(path, value, str, "a string")
    if len(value) > MAX_IMAGE_CHARS:
        _fail(path, f"{len(value)} characters", f"at most {MAX_IMAGE_CHARS} characters")
    if not IMAGE_RE.fullmatch(value):
        _fail(
            path,
            f"{show(value)} is not a container image reference",
            "HOST/PATH[:TAG][@sha256:DIGEST] like us-docker.pkg.dev/my-project/repo/trainer:v1",
        )
    return str(value)


def _args(value: Any, path: str) -> tuple[str, ...]:
    _expect_type(path, value, list, "a list of strings")
    if len(value) > MAX_ARGS:
        _fail(path, f"{len(value)} items", f"at most {MAX_ARGS} items")
    for i, a in enumerate(value):
        _expect_type(f"{path}[{i}]", a, str, "a string")
        if len(a) > MAX_ARG_CHARS:
            _fail(f"{path}[{i}]", f"{len(a)} characters", f"at most {MAX_ARG_CHARS} characters")
        if "\x00" in a:
            _fail(f"{path}[{i}]", "contains a NUL character", "any text without NUL")
    return tuple(value)


def _entries(value: Any, path: str, most: int | None = None, noun: str = "") -> list[tuple[Any, Any, str]]:
    """The (key, value, path) of each entry of an object field, once it is an object of at most `most` nouns."""
    _expect_type(path, value, dict, "an object")
    if most is not None and len(value) > most:
        _fail(path, f"{len(value)} {noun}", f"at most {most} {noun}")
    return [(k, v, f"{path}.{_key(k)}") for k, v in value.items()]


def _variable_name(path: str, name: Any) -> None:
    """A name of the trainer's environment (the keys of `env` and `secrets`)."""
    if not isinstance(name, str) or not ENV_KEY_RE.fullmatch(name):
        _fail(path, "not a valid variable name", "names of uppercase letters, digits and _, not starting with a digit")
    if name.startswith(RESERVED_ENV_PREFIX):
        _fail(path, f"names starting with {RESERVED_ENV_PREFIX} are reserved", "any other name")


def _env(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    total = 0
    for k, v, entry in _entries(value, path):
        _variable_name(entry, k)
        _expect_type(entry, v, str, "a string")  # a type name only: values are never echoed
        if "\x00" in v:
            _fail(entry, "the value contains a NUL character", "any text without NUL")
        total += len(k.encode()) + len(v.encode("utf-8", "surrogatepass"))
    if total > MAX_ENV_BYTES:
        _fail(path, f"{total} bytes of names and values", f"at most {MAX_ENV_BYTES} bytes")
    return tuple(sorted(value.items()))


def _secrets(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    """{VARIABLE: Secret Manager version reference}: references only, resolved on the machine by its account."""
    for k, v, entry in _entries(value, path, MAX_SECRETS, "secrets"):
        _variable_name(entry, k)
        _string(entry, v, SECRET_REF_RE, SECRET_REF_ALLOWED, "a Secret Manager secret version")
    return tuple(sorted(value.items()))


LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _labels(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    for k, v, entry in _entries(value, path, MAX_LABELS, "labels"):
        if not isinstance(k, str) or not LABEL_KEY_RE.fullmatch(k):
            _fail(entry, "not a valid label key", "1-63 lowercase letters, digits, _ and -, starting with a letter")
        if k.startswith(RESERVED_LABEL_PREFIX):
            _fail(entry, f"keys starting with {RESERVED_LABEL_PREFIX} are reserved", "any other key")
        _string(entry, v, LABEL_VALUE_RE, "0-63 lowercase letters, digits, _ and -", "a valid label value")
    return tuple(sorted(value.items()))


GS_URI_RE = re.compile(r"^gs://([^/]*)/(.*)$")
OBJECT_PATH_RE = re.compile(r"^[A-Za-z0-9._~=+@,-]+(?:/[A-Za-z0-9._~=+@,-]+)*/?$")
BUCKET_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{1,220}[a-z0-9])$")
IPV4_RE = re.compile(r"^[0-9]{1,3}(?:\.[0-9]{1,3}){3}$")


def _checkpoint_uri(value: Any, path: str) -> str:
    allowed = "gs://BUCKET/PATH with a valid bucket name and a path of letters, digits and ._~=+@,-/"
    _expect_type(path, value, str, "a string")
    if len(value) > MAX_URI_CHARS:
        _fail(path, f"{len(value)} characters", f"at most {MAX_URI_CHARS} characters")
    m = GS_URI_RE.fullmatch(value)
    if not m:
        _fail(path, f"{show(value)} is not a gs:// URI with a path", allowed)
    bucket, object_path = m.group(1), m.group(2)
    if not _valid_bucket(bucket):
        _fail(path, f"{show(bucket)} is not a valid bucket name", allowed)
    if not OBJECT_PATH_RE.fullmatch(object_path) or any(part in (".", "..") for part in object_path.split("/")):
        _fail(path, f"{show(object_path)} is not a valid object path", allowed)
    return str(value)


def _valid_bucket(name: str) -> bool:
    """Cloud Storage bucket naming rules (the ones a URI can break)."""
    if not BUCKET_RE.fullmatch(name) or IPV4_RE.fullmatch(name) or name.startswith("goog") or "google" in name:
        return False
    if "." not in name:
        return len(name) <= 63
    return all(0 < len(part) <= 63 for part in name.split("."))


def parse_ttl(
    value: Any, field: str = "ttl", lo: int = TTL_MIN_S, hi: int = TTL_MAX_S, allowed: str | None = None
) -> int:
    """A TTL ("90s", "30m", "48h", "2d" or integer seconds) -> seconds, within lo (default 60 s) .. hi (14 d)."""
    allowed = allowed or f"a duration like 90s, 30m, 48h, 2d or integer seconds, from {format_ttl(lo)} to 14d"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        _fail(field, f"expected a duration string or an integer, got {_type_name(value)}", allowed)
    if isinstance(value, str):
        m = TTL_RE.fullmatch(value)
        if not m:
            _fail(field, f"{show(value)} is not a duration", allowed)
        seconds = int(m.group(1)) * TTL_UNITS[m.group(2)]
    else:
        seconds = value
    if not lo <= seconds <= hi:
        _fail(field, f"{show(value)} is out of range", allowed)
    return int(seconds)


def format_ttl(seconds: int) -> str:
    """The inverse of parse_ttl: the largest whole unit ("2d", "90m", "45s")."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _format_optional_ttl(seconds: int | None) -> str | None:
    return None if seconds is None else format_ttl(seconds)


def _hang_timeout(value: Any, path: str) -> int | None:
    """`off` (or null) -> None (no hang detection); else a duration from 2m to 14d."""
    if value is None or value == "off":
        return None
    if isinstance(value, str) and not TTL_RE.fullmatch(value):
        _fail(path, f"{show(value)} is not a duration", "off, or a duration from 2m to 14d like 30m")
    return parse_ttl(value, path, HANG_TIMEOUT_MIN_S)


def _format_off_or_duration(seconds: int | None) -> str:
    return "off" if seconds is None else format_ttl(seconds)


def _preemption_notice(value: Any, path: str) -> int | None:
    """`off` (or null) -> None; else a duration from 1s to 1h, the metadata notice before a Spot VM's soft off."""
    if value is None or value == "off":
        return None
    allowed = "off, or a duration from 1s to 1h like 90s (a Spot VM on Compute Engine)"
    return parse_ttl(value, path, 1, PREEMPTION_NOTICE_MAX_S, allowed)


def _max_preemptions(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, f"expected null or an integer, got {_type_name(value)}", "null (unlimited) or 0 or more")
    if not 0 <= value <= MAX_PREEMPTIONS:
        _fail(path, f"{show(value)} is out of range", f"null (unlimited) or 0 to {MAX_PREEMPTIONS}")
    return value


# ---------------------------------------------------------------------------- the table of fields


def _as_is(value: Any) -> Any:
    return value


def _shown_always(model: Any) -> bool:
    return True


@dataclass(frozen=True)
class Field:
    """One field of a message object: how its value is read into the model and written back.

    An absent field takes the model's default for its attribute (model.py), so each default is written once; the
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


class _Reading:
    """One message object being read. Unknown and missing fields are rejected at once; then each field is parsed on
    first use (an absent one is its default), so a reader may check first the fields that others depend on."""

    def __init__(self, shape: Shape, message: Any, path: str) -> None:
        _expect_type(path, message, dict, "an object")
        _only(path, message, shape.names)
        for f in shape.fields:
            if f.required and f.name not in message:
                _fail(_join(path, f.name), "missing", shape.missing_allowed)
        self.shape, self.message, self.path = shape, message, path
        self._values: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            given = name in self.message
            parse = self.shape.by_name[name].parse
            self._values[name] = (
                parse(self.message[name], _join(self.path, name)) if given else self.shape.defaults[name]
            )
        return self._values[name]

    def set(self, name: str, value: Any) -> None:
        """A field's value taken from elsewhere in the message (a tiered job's zones are its first tier's)."""
        self._values[name] = value

    def model_values(self) -> dict[str, Any]:
        """The model's attributes, read in the table's order (after any the reader read first)."""
        return {f.model_name: self[f.name] for f in self.shape.model_fields}


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _render(shape: Shape, model: Any) -> dict[str, Any]:
    """The message object of a model value, the inverse of reading it: the tag first, then the fields shown."""
    message: dict[str, Any] = dict([shape.tag]) if shape.tag else {}
    for f in shape.model_fields:
        value = getattr(model, f.model_name)
        if f.shown_if(model) and not (f.omitted_when_default and value == shape.defaults[f.name]):
            message[f.name] = f.render(value)
    return message


# ---------------------------------------------------------------------------- the objects of a message


def default_api(accelerator_type: str) -> str:
    """The API a TPU goes through when its machine names none: Compute Engine for the generations it offers."""
    return API_COMPUTE if accelerator_type.rpartition("-")[0] in COMPUTE_GENERATIONS else API_TPU


def _tpu_machine(fields: _Reading) -> TpuMachine:
    accelerator_type = fields["accelerator_type"]  # first: the API and what it takes depend on it
    if "api" not in fields.message:
        fields.set("api", default_api(accelerator_type))
    if fields["api"] == API_COMPUTE:
        _compute_tpu(fields, accelerator_type)
    else:
        _tpu_api_tpu(fields, accelerator_type)
    fields["queue_timeout"]
    return TpuMachine(**fields.model_values())


def _compute_tpu(fields: _Reading, accelerator_type: str) -> None:
    """A TPU through Compute Engine: a generation it makes (each of its sizes has a shape, topology.COMPUTE), a boot
    image instead of a runtime version."""
    generation = accelerator_type.rpartition("-")[0]
    if generation not in COMPUTE_GENERATIONS:
        problem = f'"compute" does not offer {generation}'
        _fail(_join(fields.path, "api"), problem, f"tpu (Compute Engine offers {COMPUTE_OFFERS})")
    how = "" if "api" in fields.message else f", the default for {generation}"
    for name, instead in (("runtime_version", "machine.image"), ("request", "a flex-start tier to wait in a queue")):
        if name in fields.message:
            _fail(_join(fields.path, name), f"not used with api compute{how}", f'{instead}, or machine.api "tpu"')
    fields["image"]


def _tpu_api_tpu(fields: _Reading, accelerator_type: str) -> None:
    """A TPU through the Cloud TPU API: a generation it makes, a runtime version, a node or a queued resource."""
    generation = accelerator_type.rpartition("-")[0]
    if generation not in TPU_API_GENERATIONS:
        _fail(_join(fields.path, "api"), f'"tpu" does not offer {generation}', "compute")
    if "image" in fields.message:
        _fail(_join(fields.path, "image"), "not used with api tpu", 'machine.runtime_version, or machine.api "compute"')
    if fields["runtime_version"] is None:
        _fail(_join(fields.path, "runtime_version"), "missing", "required for api tpu")
    if fields["request"] != "queued" and "queue_timeout" in fields.message:
        _fail(_join(fields.path, "queue_timeout"), "only a queued request waits in a queue", 'request "queued"')


def _gpu_machine(fields: _Reading) -> GpuMachine:
    fields["accelerator_count"]  # the count is checked before the types
    return GpuMachine(**fields.model_values())


def _queue_timeout_shown(machine: MachineSpec) -> bool:
    """A queued resource always says how long it waits; a Compute Engine machine only when it was given (it is
    allowed only with a flex-start tier, which the machine's own message does not show)."""
    if isinstance(machine, TpuMachine) and machine.api == API_TPU:
        return machine.request == "queued"
    return machine.queue_timeout_s != QUEUE_TIMEOUT_DEFAULT_S


QUEUE_TIMEOUT_DEFAULT_S = TpuMachine.queue_timeout_s


TPU_MACHINE = Shape(
    TpuMachine,
    (
        Field("accelerator_type", _tpu_type, required=True),
        # absent: compute for the generations Compute Engine offers, tpu for the others (default_api)
        Field("api", _one_of(APIS, "an API")),
        Field(
            "runtime_version",
            _optional(
                _matching(
                    re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$"),
                    "a TPU runtime version like v2-alpha-tpuv5-lite or tpu-ubuntu2204-base",
                    "a TPU runtime version",
                )
            ),
            shown_if=lambda machine: machine.api == API_TPU,
        ),
        # api compute: the boot image; absent, the generation's default image family (topology.COMPUTE)
        Field("image", _optional(_boot_image), shown_if=lambda m: m.api == API_COMPUTE, omitted_when_default=True),
        Field("request", _request, shown_if=lambda machine: machine.api == API_TPU),
        # how long one zone may keep the request waiting for capacity before the next zone is tried: a queued
        # resource (api tpu), or a flex-start request (api compute, checked against the tiers in _submit)
        Field(
            "queue_timeout",
            parse_ttl,
            format_ttl,
            attribute="queue_timeout_s",
            shown_if=_queue_timeout_shown,
        ),
    ),
    "required for kind tpu",
    tag=("kind", TpuMachine.kind),
)
GPU_MACHINE = Shape(
    GpuMachine,
    (
        Field(
            "machine_type",
            _matching(
                re.compile(r"^[a-z][a-z0-9-]{1,62}$"),
                "a Compute Engine machine type like g2-standard-8 or a2-highgpu-1g",
                "a machine type",
            ),
            required=True,
        ),
        Field(
            "accelerator_type",
            _matching(
                re.compile(r"^nvidia-[a-z0-9-]+$"),
                "a GPU type like nvidia-l4, nvidia-tesla-a100, nvidia-h100-80gb",
                "a GPU accelerator type",
            ),
            required=True,
        ),
        Field("accelerator_count", _gpu_count, required=True),
        Field("boot_disk_gb", _within(*BOOT_DISK_GB)),
        # a flex-start tier: how long one zone may keep the request waiting (checked against the tiers in _submit)
        Field("queue_timeout", parse_ttl, format_ttl, attribute="queue_timeout_s", shown_if=_queue_timeout_shown),
    ),
    "required for kind gpu",
    tag=("kind", GpuMachine.kind),
)
MACHINES: dict[str, tuple[Shape, Callable[[_Reading], MachineSpec]]] = {
    TpuMachine.kind: (TPU_MACHINE, _tpu_machine),
    GpuMachine.kind: (GPU_MACHINE, _gpu_machine),
}
MACHINE_KINDS = " or ".join(f'"{kind}"' for kind in MACHINES)


def _machine(value: Any, path: str) -> MachineSpec:
    _expect_type(path, value, dict, "an object")
    kind = value.get("kind")
    for name, (shape, read) in MACHINES.items():
        if kind == name:
            return read(_Reading(shape, value, path))
    if "kind" not in value:
        _fail(_join(path, "kind"), "missing", MACHINE_KINDS)
    _fail(_join(path, "kind"), f"{show(kind)} is not a machine kind", MACHINE_KINDS)


def _machine_message(machine: MachineSpec) -> dict[str, Any]:
    return _render(MACHINES[machine.kind][0], machine)


# When a tier gives way to the next; each is a Tier attribute, and absent (or null) is never.
MOVE_ON = Shape(
    Tier,
    (
        Field("after_preemptions", _optional(_within(1, 10_000)), omitted_when_default=True),
        Field("after_stockout", _optional(parse_ttl), format_ttl, "after_stockout_s", omitted_when_default=True),
        Field("deadline_within", _optional(parse_ttl), format_ttl, "deadline_within_s", omitted_when_default=True),
    ),
)
TIER = Shape(
    Tier,
    (
        Field("provisioning", _one_of(TIER_PROVISIONING, "a provisioning model"), required=True),
        Field("zones", _zones, list, required=True),
        Field(
            "reservation",
            _optional(
                _matching(
                    re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$"),
                    "a reservation name like tpu-res-1",
                    "a reservation name",
                )
            ),
            omitted_when_default=True,
        ),
        # flex-start: the machine's maximum run duration; absent, the time left to the job's TTL (at most 7d)
        Field(
            "max_run_duration",
            _optional(_max_run_duration),
            _format_optional_ttl,
            "max_run_duration_s",
            omitted_when_default=True,
        ),
        # a fallback tier (not Spot): the least time on it before the job may go back to Spot; null: it never does
        Field(
            "back_to_spot_after",
            _optional(parse_ttl),
            _format_optional_ttl,
            "back_to_spot_after_s",
            shown_if=lambda tier: tier.provisioning not in SPOT_PROVISIONING,
            omitted_when_default=True,
        ),
        Field("move_on", lambda value, path: value),  # read and written as MOVE_ON, whose fields are the tier's
    ),
    "required in every tier",
)


def _tier(value: Any, path: str, *, last: bool) -> Tier:
    fields = _Reading(TIER, value, path)
    provisioning = fields["provisioning"]
    named = value.get("reservation") is not None
    if provisioning == "reservation" and not named:
        _fail(_join(path, "reservation"), "missing", "the name of a reservation in the tier's zones")
    if provisioning != "reservation" and named:
        _fail(_join(path, "reservation"), "only a reservation tier names a reservation", 'provisioning "reservation"')
    fields["reservation"]
    _run_duration_only_with_flex_start(fields, provisioning)
    if provisioning in SPOT_PROVISIONING and "back_to_spot_after" in value:
        problem = "a Spot tier has no Spot to go back to"
        allowed = "back_to_spot_after on a standard, reservation or flex-start tier"
        _fail(_join(path, "back_to_spot_after"), problem, allowed)
    fields["back_to_spot_after"]
    rules = value.get("move_on", {})
    move_on = _Reading(MOVE_ON, rules, _join(path, "move_on"))
    if rules and last:
        _fail(move_on.path, "the last tier has no tier to move on to", "move_on on any tier but the last")
    if not rules and not last:
        _fail(move_on.path, "missing: this tier would never move on", ", ".join(MOVE_ON.names))
    return Tier(**fields.model_values(), **move_on.model_values())


def _tiers(value: Any, path: str) -> tuple[Tier, ...]:
    """Ordered ways of getting machines: [{provisioning, zones, reservation?, move_on?}, ...]."""
    _expect_type(path, value, list, "a list of tiers")
    if not 1 <= len(value) <= MAX_TIERS:
        _fail(path, f"{len(value)} tiers", f"1 to {MAX_TIERS} tiers, in the order to try them")
    return tuple(_tier(tier, f"{path}[{i}]", last=i == len(value) - 1) for i, tier in enumerate(value))


def _tier_message(tier: Tier) -> dict[str, Any]:
    move_on = _render(MOVE_ON, tier)
    return {**_render(TIER, tier), **({"move_on": move_on} if move_on else {})}


def _untiered(spec: JobSpec) -> bool:
    return not spec.tiers


def _run_duration_only_with_flex_start(fields: _Reading, provisioning: str) -> None:
    """max_run_duration (a tier's, or an untiered job's) goes with provisioning flex-start only."""
    if provisioning != FLEX_START and fields.message.get("max_run_duration") is not None:
        path = _join(fields.path, "max_run_duration")
        _fail(path, "only a flex-start machine has a maximum run duration", f'provisioning "{FLEX_START}"')
    fields["max_run_duration"]


SUBMIT = Shape(
    JobSpec,
    (
        Field("job_id", _job_id, required=True),
        Field("machine", _machine, _machine_message, required=True),
        Field("zones", _zones, list, shown_if=_untiered),  # required unless tiers are given
        Field("provisioning", _one_of(PROVISIONING, "a provisioning model"), shown_if=_untiered),
        Field("image", _image, required=True),
        Field("args", _args, list),
        Field("env", _env, dict),
        Field("secrets", _secrets, dict, omitted_when_default=True),
        Field("checkpoint_uri", _checkpoint_uri, required=True),
        Field("ttl", parse_ttl, format_ttl, "ttl_s"),
        Field("max_preemptions", _max_preemptions),
        Field("max_failures", _within(0, MAX_FAILURES)),
        Field("labels", _labels, dict),
        Field("hang_timeout", _hang_timeout, _format_off_or_duration, "hang_timeout_s"),
        Field("tiers", _tiers, lambda tiers: [_tier_message(t) for t in tiers], omitted_when_default=True),
        Field(
            "max_run_duration",
            _optional(_max_run_duration),
            _format_optional_ttl,
            "max_run_duration_s",
            shown_if=_untiered,
            omitted_when_default=True,
        ),
        Field("placement", _one_of(PLACEMENTS, "a placement"), omitted_when_default=True),
        # on a running machine's notice, request the next machine at once (decide's head start)
        Field("head_start", _boolean, omitted_when_default=True),
        # a Spot VM's metadata notice before its soft off, asked of Compute Engine (its machines only)
        Field(
            "preemption_notice",
            _preemption_notice,
            _format_off_or_duration,
            "preemption_notice_s",
            omitted_when_default=True,
        ),
    ),
    "required for action submit",
    tag=("action", "submit"),
)
CANCEL = Shape(
    CancelRequest, (Field("job_id", _job_id, required=True),), "the id of the job to cancel", ("action", "cancel")
)


def parse_job_message(data: bytes | str | dict[str, Any]) -> JobSpec | CancelRequest:
    """A job message (JSON bytes/str or a decoded object) -> JobSpec (submit) or CancelRequest (cancel).

    Raises SpecError (one line: field, problem, what is allowed) on anything invalid, and nothing else.
    """
    message = _decode(data)
    if "action" not in message:
        _fail("action", "missing", '"submit" or "cancel"')
    action = message["action"]
    if action == "cancel":
        return _cancel(message)
    if action != "submit":
        _fail("action", f"{show(action)} is not an action", '"submit" or "cancel"')
    return _submit(message)


def _cancel(message: dict[str, Any]) -> CancelRequest:
    for name in message:
        if name not in CANCEL.names:
            problem = 'not allowed with action "cancel"' if name in SUBMIT.names else "unknown field"
            _fail(_key(name), problem, ", ".join(CANCEL.names))
    return CancelRequest(**_Reading(CANCEL, message, "").model_values())


def _submit(message: dict[str, Any]) -> JobSpec:
    fields = _Reading(SUBMIT, message, "")
    tiers = fields["tiers"]  # first: whether zones and provisioning may be given depends on it
    for name in ("zones", "provisioning", "max_run_duration"):
        if tiers and name in message:
            _fail(name, "not allowed with tiers", f"{name} inside each tier")
    if not tiers and "zones" not in message:
        _fail("zones", "missing", "required for action submit (or tiers, each with its zones)")
    if tiers:  # tier 0 is also the job's zones and provisioning (what the first attempt uses)
        fields.set("zones", tiers[0].zones)
        fields.set("provisioning", tiers[0].provisioning)
        fields.set("max_run_duration", tiers[0].max_run_duration_s)
    else:
        _run_duration_only_with_flex_start(fields, fields["provisioning"])
    values = fields.model_values()
    for name in sorted(dict(values["secrets"]).keys() & dict(values["env"]).keys()):
        _fail(f"secrets.{name}", "the variable is also set in env", "each variable in env or in secrets, not both")
    spec = JobSpec(**values)
    _provisioning_fits_the_api(spec)
    _queue_timeout_fits(spec, message["machine"])
    return spec


def _tier_paths(spec: JobSpec) -> list[tuple[str, Tier]]:
    """Each tier with the path of its provisioning in the message."""
    if not spec.tiers:
        return [("provisioning", spec.all_tiers[0])]
    return [(f"tiers[{i}].provisioning", tier) for i, tier in enumerate(spec.tiers)]


def _provisioning_fits_the_api(spec: JobSpec) -> None:
    """Flex-start is Compute Engine's; preemptible TPUs are the Cloud TPU API's (Compute Engine has Spot TPUs)."""
    api = spec.machine.api
    for path, tier in _tier_paths(spec):
        if tier.provisioning == FLEX_START and api != API_COMPUTE:
            problem = "\"flex-start\" is Compute Engine's, not the Cloud TPU API's"
            allowed = f'machine.api "compute" ({COMPUTE_OFFERS}), or request "queued" to wait'
            _fail(path, problem, allowed)
        if tier.provisioning == "preemptible" and isinstance(spec.machine, TpuMachine) and api == API_COMPUTE:
            _fail(path, '"preemptible" is not offered for TPUs on Compute Engine', 'spot, or machine.api "tpu"')
    if spec.preemption_notice_s is not None and api != API_COMPUTE:
        problem = "the Cloud TPU API has no preemption notice to ask for (a Compute Engine Spot VM's)"
        _fail("preemption_notice", problem, f'off, or machine.api "compute" ({COMPUTE_OFFERS})')
    if spec.preemption_notice_s is not None and not any(t.provisioning == "spot" for t in spec.all_tiers):
        allowed = 'off, or a tier with provisioning "spot"'
        _fail("preemption_notice", "only a Spot VM gets it, and no tier is spot", allowed)


def _queue_timeout_fits(spec: JobSpec, machine: dict[str, Any]) -> None:
    """On Compute Engine only a flex-start request waits for capacity, and an instance waits at most 2 hours."""
    if spec.machine.api != API_COMPUTE:
        return
    flex_start = any(tier.provisioning == FLEX_START for tier in spec.all_tiers)
    if "queue_timeout" in machine and not flex_start:
        allowed = f'a tier with provisioning "{FLEX_START}"'
        _fail("machine.queue_timeout", "only a flex-start request waits for capacity on Compute Engine", allowed)
    if flex_start and spec.machine.queue_timeout_s > FLEX_START_QUEUE_MAX_S:
        problem = f"{show(machine['queue_timeout'])} is longer than Compute Engine waits for flex-start capacity"
        _fail("machine.queue_timeout", problem, f"at most {format_ttl(FLEX_START_QUEUE_MAX_S)}")


def spec_to_message(spec: JobSpec) -> dict[str, Any]:
    """The submit message for a JobSpec: parse_job_message(spec_to_message(s)) == s."""
    message = _render(SUBMIT, spec)
    if spec.tiers:  # a tiered job's tiers stand where an untiered job's zones and provisioning do
        leading = ("action", "job_id", "machine", "tiers")
        return {**{name: message[name] for name in leading}, **message}
    return message


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
