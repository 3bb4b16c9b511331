"""Cloud API errors -> respawn's provider errors (capacity, quota, permanent, transient).

A create refused because the zone does not offer the machine or accelerator type is an UnofferedError (a
capacity error that never ends: decide skips the zone from then on), not a permanent one: refused at once (a 400 or
404), or reported inside an operation or a resource, as a MIG reports a VM it could not create (its `lastAttempt`
errors, its bulk creation's last progress check), whose HTTP status says nothing.

The HTTP status alone does not tell them apart: 429 RESOURCE_EXHAUSTED is a
rate limit on a request but "no capacity" inside a TPU create operation; a
Compute stockout is an operation error with HTTP 503; a Compute quota error is
a 403. So the message and the error codes/reasons decide first, the status after.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable
from typing import TypeVar

import requests
from google.api_core import exceptions as gexc
from google.api_core import retry as gretry

from respawn.ports import CapacityError, PermanentError, ProviderError, QuotaError, TransientError, UnofferedError

_RATE_LIMIT = re.compile(r"per minute|per second|rate ?limit|rate_limit|too many requests|requests per", re.I)
_CAPACITY = re.compile(
    r"zone_resource_pool_exhausted|no more capacity|stockout|does not have enough resources|"
    r"insufficient (reserved )?capacity|resource_pool_exhausted",
    re.I,
)
_QUOTA = re.compile(r"quota", re.I)
# The zone does not offer the machine or accelerator type asked for: Compute Engine's "Machine type with name 'T'
# does not exist in zone 'Z'", the same of an accelerator type, or a type's zonal URL "was not found"; the Cloud TPU
# API's accelerator type "not available / not supported / not found in zone".
_UNOFFERED = re.compile(
    r"(machine|accelerator) type\b[^.]*\b(does not exist|(is )?not (available|supported|offered|found))\b[^.]*"
    r"\bzone\b|/(machineTypes|acceleratorTypes)/[^'\s]+'? was not found",
    re.I,
)
# Also a template or workload policy still used by a MIG whose deletion is under way: deleting it again later works.
_NOT_READY = re.compile(
    r"not ready|resourcenotready|being (created|deleted)|operation in progress|being used by|resourceinusebyanother",
    re.I,
)
_TRANSIENT_TYPES = (
    gexc.TooManyRequests,
    gexc.ServerError,  # 5xx: InternalServerError, ServiceUnavailable, GatewayTimeout, ...
    gexc.DeadlineExceeded,
    gexc.Aborted,
    gexc.RetryError,
    gexc.FailedPrecondition,
    requests.exceptions.RequestException,
    concurrent.futures.TimeoutError,
    TimeoutError,
    ConnectionError,
)
_PERMANENT_TYPES = (gexc.BadRequest, gexc.Forbidden, gexc.Unauthorized, gexc.NotFound, gexc.MethodNotAllowed)


def error_text(exc: BaseException) -> str:
    """The service's own words: message, reasons and status (never the request URL, which holds user names)."""
    if isinstance(exc, gexc.GoogleAPICallError):
        parts = []
        payload = _payload(exc)
        parts.append(str(payload.get("message") or _strip_url(exc.message)))
        parts += [str(e.get("reason", "")) for e in exc.errors if isinstance(e, dict)]
        parts.append(str(payload.get("status", "")))
        if exc.reason:
            parts.append(exc.reason)
        return " ".join(p for p in parts if p)
    return str(exc)


def classify(exc: BaseException, what: str, in_operation: bool = False) -> ProviderError:
    """A ProviderError for `exc` raised while doing `what` (e.g. "create TPU node x in us-central1-a").

    in_operation: the error ended a long-running operation (after the request was accepted) or a resource reports
    it, where RESOURCE_EXHAUSTED means no capacity rather than a rate limit, and the HTTP status does not tell an
    unoffered type from anything else.
    """
    if isinstance(exc, ProviderError):
        return exc
    text = error_text(exc)
    detail = f"{what}: {text or type(exc).__name__}"
    if _RATE_LIMIT.search(text):
        return TransientError(detail)
    if _CAPACITY.search(text):
        return CapacityError(detail)
    if _UNOFFERED.search(text) and (in_operation or isinstance(exc, (gexc.BadRequest, gexc.NotFound))):
        return UnofferedError(detail)
    if _QUOTA.search(text):
        return QuotaError(detail)
    if in_operation and isinstance(exc, gexc.TooManyRequests):  # code 8 with no telling message
        return CapacityError(detail)
    if _NOT_READY.search(text):
        return TransientError(detail)
    if isinstance(exc, gexc.Conflict) and not isinstance(exc, gexc.AlreadyExists):
        return TransientError(detail)  # 409 ABORTED: a concurrent change
    if isinstance(exc, _TRANSIENT_TYPES):
        return TransientError(detail)
    if isinstance(exc, _PERMANENT_TYPES):
        return PermanentError(detail)
    if isinstance(exc, gexc.ClientError):
        return PermanentError(detail)
    return TransientError(detail)  # unknown: let Pub/Sub retry (dead-lettered after N attempts)


_T = TypeVar("_T")


def deleting(call: Callable[[], _T], what: str) -> _T | None:
    """Run a delete call: NotFound is done (None), any other error classified as `what`."""
    try:
        return call()
    except gexc.NotFound:
        return None
    except Exception as e:
        raise classify(e, what) from e


def read_retry(seconds: float) -> gretry.Retry | None:
    """A short in-call retry for reads (get/list) on 5xx and timeouts; None when `seconds` is 0.

    The client libraries' defaults retry reads for up to 10 minutes, longer than a function may run.
    """
    if seconds <= 0:
        return None
    predicate = gretry.if_exception_type(gexc.ServiceUnavailable, gexc.InternalServerError, gexc.DeadlineExceeded)
    return gretry.Retry(predicate=predicate, initial=0.2, maximum=2.0, multiplier=2.0, timeout=seconds)


def is_already_exists(exc: BaseException) -> bool:
    if isinstance(exc, gexc.AlreadyExists):
        return True
    return isinstance(exc, gexc.Conflict) and re.search(r"already[ _]?exists", error_text(exc), re.I) is not None


def _payload(exc: gexc.GoogleAPICallError) -> dict[str, object]:
    response = exc.response
    try:
        error = response.json().get("error", {}) if response is not None and hasattr(response, "json") else {}
    except ValueError:
        return {}
    return error if isinstance(error, dict) else {}


def _strip_url(message: str) -> str:
    """api_core formats REST errors as "METHOD URL: message"."""
    return re.sub(r"^[A-Z]+ \S+: ", "", message)
