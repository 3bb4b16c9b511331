"""One field's value: the limits and patterns of the job message, SpecError, and a parser per kind of value.

Each parser takes the value and its path in the message (`tiers[1].zones`) and returns the model's value, or raises
SpecError naming that path. Every error is one line: values are quoted JSON-style and cut short (`show`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

from respawn.jobs import API_COMPUTE, API_TPU, FLEX_START_MAX_RUN_S, RESERVED_MODELS, Provisioning
from respawn.topology import UnknownTpuType, tpu_topology

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

TIER_PROVISIONING = tuple(p.value for p in Provisioning)
PROVISIONING = tuple(p for p in TIER_PROVISIONING if p not in RESERVED_MODELS)  # a job without tiers (no reservation)
# ranked: each attempt's zone by the outlook (history, advice, price); ordered: the list's order, the same zone again
PLACEMENTS = ("ranked", "ordered")
REQUESTS = ("queued", "node")
APIS = (API_COMPUTE, API_TPU)
# Compute Engine's requestValidForDuration, how long an instance insert waits for flex-start capacity, is at most
# 2 hours: "must be at least 90 and less or equal to 7200 seconds" is the API's own error as users report it; no
# Google page states the range, so a flex-start job's queue_timeout stays inside it.
FLEX_START_QUEUE_MAX_S = 2 * 3600
FLEX_START_QUEUE_MIN_S = 90  # the same error's lower bound, and the instance lifecycle page's "90 seconds or longer"
# A zonal managed instance group holds at most 1,000 VMs (compute/docs/instance-groups: "up to 1,000 VMs" per zonal
# MIG), so a Compute Engine slice of more VMs cannot be made.
ZONAL_MIG_MAX_VMS = 1000
# A slice's MIG names its VMs JOB-aN-w-x7k2: a job id ending in -aN-w could name an instance the same way.
SLICE_VM_LIKE_RE = re.compile(r"-a[1-9][0-9]*-w$")
# A boot image or image family: projects/PROJECT/global/images/(family/)NAME, optionally as a full API URL.
BOOT_IMAGE_RE = re.compile(
    r"^(?:https://(?:www|compute)\.googleapis\.com/compute/v1/)?"
    r"projects/[a-z][a-z0-9-]{4,61}[a-z0-9]/global/images/(?:family/)?[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$"
)
MAX_TIERS = 5
GPU_COUNTS = (1, 2, 4, 8, 16)
# A GPU machine's VMs (machine.vms): a MIG of at most this many, as one slice (64 A3 VMs are 512 H100s)
MAX_GPU_VMS = 64
# A job's slices (machine.slices): one world of at most this many, each its own machine (docs/design/several-slices.md)
MAX_SLICES = 64
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


def fail(field: str, problem: str, allowed: str) -> NoReturn:
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


def shown_key(name: Any) -> str:
    """A field name as it appears in an error (escaped, short; an empty name is shown as <empty>)."""
    return one_line(str(name), 40) or "<empty>"


def type_name(value: Any) -> str:
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


def expect_type(field: str, value: Any, typ: type, name: str) -> None:
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if not ok:
        fail(field, f"expected {name}, got {type_name(value)}", name)


def string_matching(field: str, value: Any, regex: re.Pattern[str], allowed: str, what: str) -> str:
    expect_type(field, value, str, "a string")
    if not regex.fullmatch(value):
        fail(field, f"{show(value)} is not {what}", allowed)
    return str(value)


def integer_within(field: str, value: Any, lo: int, hi: int) -> int:
    expect_type(field, value, int, "an integer")
    if not lo <= value <= hi:
        fail(field, f"{show(value)} is out of range", f"an integer from {lo} to {hi}")
    return int(value)


def only(field: str, obj: dict[Any, Any], allowed: tuple[str, ...]) -> None:
    for k in obj:
        if k not in allowed:
            path = f"{field}.{shown_key(k)}" if field else shown_key(k)
            fail(path, "unknown field", ", ".join(allowed))


# ---------------------------------------------------------------------------- one field's value
# Each parser takes the value and its path in the message (`tiers[1].zones`) and returns the model's value.


def matching(regex: re.Pattern[str], allowed: str, what: str) -> Parse:
    """A parser of a string that must match regex: `"x" is not <what>; allowed: <allowed>`."""
    return lambda value, path: string_matching(path, value, regex, allowed, what)


def within(lo: int, hi: int) -> Parse:
    """A parser of an integer from lo to hi."""
    return lambda value, path: integer_within(path, value, lo, hi)


def one_of(options: tuple[str, ...], what: str) -> Parse:
    """A parser of a string that must be one of options."""

    def parse(value: Any, path: str) -> str:
        expect_type(path, value, str, "a string")
        if value not in options:
            fail(path, f"{show(value)} is not {what}", ", ".join(options))
        return str(value)

    return parse


def boolean(value: Any, path: str) -> bool:
    expect_type(path, value, bool, "true or false")
    return bool(value)


def optional(parse: Parse) -> Parse:
    """A parser that also takes null, as None."""
    return lambda value, path: None if value is None else parse(value, path)


def job_id(value: Any, path: str) -> str:
    job_id = string_matching(
        path,
        value,
        JOB_ID_RE,
        "1-39 characters: lowercase letters, digits and '-', starting with a letter, not ending with '-'",
        "a valid job id",
    )
    if SLICE_VM_LIKE_RE.search(job_id):
        fail(path, f"{show(job_id)} ends like a slice's VM names (JOB-aN-w-x7k2)", "a job id not ending in -aN-w")
    return job_id


def tpu_type(value: Any, path: str) -> str:
    """A TPU accelerator type of a size Cloud TPU has (topology.py's table)."""
    accelerator_type = string_matching(
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
        fail(path, problem, allowed)
    return accelerator_type


def boot_image(value: Any, path: str) -> str:
    return string_matching(
        path,
        value,
        BOOT_IMAGE_RE,
        "projects/PROJECT/global/images/family/FAMILY or projects/PROJECT/global/images/IMAGE",
        "a boot image or image family",
    )


def max_run_duration(value: Any, path: str) -> int:
    """A flex-start machine's run time: a duration from 1 minute to Compute Engine's 7 days."""
    seconds = parse_ttl(value, path)
    if seconds > FLEX_START_MAX_RUN_S:
        fail(path, f"{show(value)} is out of range", "a duration like 90m, 48h or 7d, from 1m to 7d")
    return seconds


def request(value: Any, path: str) -> str:
    if value not in REQUESTS:
        fail(path, f"{show(value)} is not a request mode", '"queued" (a queued resource) or "node"')
    return str(value)


def gpu_count(value: Any, path: str) -> int:
    expect_type(path, value, int, "an integer")
    if value not in GPU_COUNTS:
        fail(path, f"{show(value)} is not a GPU count", "one of " + ", ".join(str(n) for n in GPU_COUNTS))
    return int(value)


def zones(value: Any, path: str) -> tuple[str, ...]:
    expect_type(path, value, list, "a list of zones")
    if not value:
        fail(path, "the list is empty", "1 to 20 zone names like us-central1-a, in order of preference")
    if len(value) > MAX_ZONES:
        fail(path, f"{len(value)} zones", f"at most {MAX_ZONES} zones")
    zones: list[str] = []
    for i, z in enumerate(value):
        zone = string_matching(f"{path}[{i}]", z, ZONE_RE, "a zone name like us-central1-a", "a zone")
        if zone in zones:
            fail(f"{path}[{i}]", f"{show(zone)} is listed twice", "each zone once")
        zones.append(zone)
    return tuple(zones)


def image(value: Any, path: str) -> str:
    expect_type(path, value, str, "a string")
    if len(value) > MAX_IMAGE_CHARS:
        fail(path, f"{len(value)} characters", f"at most {MAX_IMAGE_CHARS} characters")
    if not IMAGE_RE.fullmatch(value):
        fail(
            path,
            f"{show(value)} is not a container image reference",
            "HOST/PATH[:TAG][@sha256:DIGEST] like us-docker.pkg.dev/my-project/repo/trainer:v1",
        )
    return str(value)


def args(value: Any, path: str) -> tuple[str, ...]:
    expect_type(path, value, list, "a list of strings")
    if len(value) > MAX_ARGS:
        fail(path, f"{len(value)} items", f"at most {MAX_ARGS} items")
    for i, a in enumerate(value):
        expect_type(f"{path}[{i}]", a, str, "a string")
        if len(a) > MAX_ARG_CHARS:
            fail(f"{path}[{i}]", f"{len(a)} characters", f"at most {MAX_ARG_CHARS} characters")
        if "\x00" in a:
            fail(f"{path}[{i}]", "contains a NUL character", "any text without NUL")
    return tuple(value)


def _entries(value: Any, path: str, most: int | None = None, noun: str = "") -> list[tuple[Any, Any, str]]:
    """The (key, value, path) of each entry of an object field, once it is an object of at most `most` nouns."""
    expect_type(path, value, dict, "an object")
    if most is not None and len(value) > most:
        fail(path, f"{len(value)} {noun}", f"at most {most} {noun}")
    return [(k, v, f"{path}.{shown_key(k)}") for k, v in value.items()]


def _variable_name(path: str, name: Any) -> None:
    """A name of the trainer's environment (the keys of `env` and `secrets`)."""
    if not isinstance(name, str) or not ENV_KEY_RE.fullmatch(name):
        fail(path, "not a valid variable name", "names of uppercase letters, digits and _, not starting with a digit")
    if name.startswith(RESERVED_ENV_PREFIX):
        fail(path, f"names starting with {RESERVED_ENV_PREFIX} are reserved", "any other name")


def env(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    total = 0
    for k, v, entry in _entries(value, path):
        _variable_name(entry, k)
        expect_type(entry, v, str, "a string")  # a type name only: values are never echoed
        if "\x00" in v:
            fail(entry, "the value contains a NUL character", "any text without NUL")
        total += len(k.encode()) + len(v.encode("utf-8", "surrogatepass"))
    if total > MAX_ENV_BYTES:
        fail(path, f"{total} bytes of names and values", f"at most {MAX_ENV_BYTES} bytes")
    return tuple(sorted(value.items()))


def secrets(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    """{VARIABLE: Secret Manager version reference}: references only, resolved on the machine by its account."""
    for k, v, entry in _entries(value, path, MAX_SECRETS, "secrets"):
        _variable_name(entry, k)
        string_matching(entry, v, SECRET_REF_RE, SECRET_REF_ALLOWED, "a Secret Manager secret version")
    return tuple(sorted(value.items()))


LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def labels(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    for k, v, entry in _entries(value, path, MAX_LABELS, "labels"):
        if not isinstance(k, str) or not LABEL_KEY_RE.fullmatch(k):
            fail(entry, "not a valid label key", "1-63 lowercase letters, digits, _ and -, starting with a letter")
        if k.startswith(RESERVED_LABEL_PREFIX):
            fail(entry, f"keys starting with {RESERVED_LABEL_PREFIX} are reserved", "any other key")
        string_matching(entry, v, LABEL_VALUE_RE, "0-63 lowercase letters, digits, _ and -", "a valid label value")
    return tuple(sorted(value.items()))


GS_URI_RE = re.compile(r"^gs://([^/]*)/(.*)$")
OBJECT_PATH_RE = re.compile(r"^[A-Za-z0-9._~=+@,-]+(?:/[A-Za-z0-9._~=+@,-]+)*/?$")
BUCKET_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{1,220}[a-z0-9])$")
IPV4_RE = re.compile(r"^[0-9]{1,3}(?:\.[0-9]{1,3}){3}$")


def checkpoint_uri(value: Any, path: str) -> str:
    allowed = "gs://BUCKET/PATH with a valid bucket name and a path of letters, digits and ._~=+@,-/"
    expect_type(path, value, str, "a string")
    if len(value) > MAX_URI_CHARS:
        fail(path, f"{len(value)} characters", f"at most {MAX_URI_CHARS} characters")
    m = GS_URI_RE.fullmatch(value)
    if not m:
        fail(path, f"{show(value)} is not a gs:// URI with a path", allowed)
    bucket, object_path = m.group(1), m.group(2)
    if not _valid_bucket(bucket):
        fail(path, f"{show(bucket)} is not a valid bucket name", allowed)
    if not OBJECT_PATH_RE.fullmatch(object_path) or any(part in (".", "..") for part in object_path.split("/")):
        fail(path, f"{show(object_path)} is not a valid object path", allowed)
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
        fail(field, f"expected a duration string or an integer, got {type_name(value)}", allowed)
    if isinstance(value, str):
        m = TTL_RE.fullmatch(value)
        if not m:
            fail(field, f"{show(value)} is not a duration", allowed)
        seconds = int(m.group(1)) * TTL_UNITS[m.group(2)]
    else:
        seconds = value
    if not lo <= seconds <= hi:
        fail(field, f"{show(value)} is out of range", allowed)
    return int(seconds)


def format_ttl(seconds: int) -> str:
    """The inverse of parse_ttl: the largest whole unit ("2d", "90m", "45s")."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_optional_ttl(seconds: int | None) -> str | None:
    return None if seconds is None else format_ttl(seconds)


def hang_timeout(value: Any, path: str) -> int | None:
    """`off` (or null) -> None (no hang detection); else a duration from 2m to 14d."""
    if value is None or value == "off":
        return None
    if isinstance(value, str) and not TTL_RE.fullmatch(value):
        fail(path, f"{show(value)} is not a duration", "off, or a duration from 2m to 14d like 30m")
    return parse_ttl(value, path, HANG_TIMEOUT_MIN_S)


def format_off_or_duration(seconds: int | None) -> str:
    return "off" if seconds is None else format_ttl(seconds)


def preemption_notice(value: Any, path: str) -> int | None:
    """`off` (or null) -> None; else a duration from 1s to 1h, the metadata notice before a Spot VM's soft off."""
    if value is None or value == "off":
        return None
    allowed = "off, or a duration from 1s to 1h like 90s (a Spot VM on Compute Engine)"
    return parse_ttl(value, path, 1, PREEMPTION_NOTICE_MAX_S, allowed)


def max_preemptions(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        fail(path, f"expected null or an integer, got {type_name(value)}", "null (unlimited) or 0 or more")
    if not 0 <= value <= MAX_PREEMPTIONS:
        fail(path, f"{show(value)} is out of range", f"null (unlimited) or 0 to {MAX_PREEMPTIONS}")
    return value
