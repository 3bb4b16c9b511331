"""A VM metadata server's values as its scripts read them: each answer with its ETag, and the hanging GET that waits
for a value to change (https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange).

The machine's startup script learns a new world from its metadata this way (docs/design/several-slices.md, "Telling
the machines"): it never polls. What Google's page says, and what this does:

* every answer carries an `ETag` header, a hash of the value (the same value, the same ETag);
* `?wait_for_change=true` answers only once the value changed: from the one it had when the request came, or, with
  `last_etag=ETAG`, from the value that ETag names, so that an ETag that is already stale answers at once (the race
  between a read and the wait that follows it, which the page's "Use ETags" section closes this way);
* `timeout_sec=N` answers after N seconds at the latest, with the value as it is then, changed or not (an integer;
  a malformed one is refused with 400, as the metadata server refuses "improper query parameters":
  https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server).

Left open by Google's pages, and decided here: without `timeout_sec` the wait has no limit of its own (it ends with
a change, or when the server closes); a key that does not exist is a value too (404, with its own ETag), so a wait on
a missing key answers once the key appears.

Standard library only: the machine's shims import this module with `python -S` (machine_host.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from urllib.parse import parse_qs

Reply = tuple[int, bytes, dict[str, str]]  # (HTTP status, body, headers)
NOT_FOUND = b"not found"


def etag(value: bytes | None) -> str:
    """The ETag of a value (None: no such key): 16 hex digits, as the metadata server's look."""
    return hashlib.sha256(b"\x00absent" if value is None else b"\x01" + value).hexdigest()[:16]


class WatchedValues:
    """The waiters of one metadata server. Whoever changes a value does it inside `update`, which wakes them; `answer`
    reads a value (waiting for a change when asked) under the same lock, so that no change is missed between a
    waiter's read and its wait."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._closed = False

    def update(self, change: Callable[[], None]) -> None:
        """Run `change` (it changes what `answer`'s `read` returns) and wake every waiter."""
        with self._changed:
            change()
            self._changed.notify_all()

    def close(self) -> None:
        """The server is going away: every waiter answers now, with the value as it is."""
        self.update(lambda: setattr(self, "_closed", True))

    def answer(self, read: Callable[[], bytes | None], query: str) -> Reply:
        """The answer to a GET of one value: `read()` (None: no such key, 404), after waiting for it to change when
        the query asks (`wait_for_change`, `last_etag`, `timeout_sec`), with its ETag."""
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        timeout: float | None = None
        if "timeout_sec" in params:
            if not params["timeout_sec"].isdigit():
                return 400, b"timeout_sec must be a non-negative integer", {}
            timeout = float(params["timeout_sec"])
        with self._changed:
            value = read()
            if params.get("wait_for_change", "").lower() == "true":
                value = self._wait(read, params.get("last_etag") or etag(value), timeout)
            headers = {"ETag": etag(value), "Content-Type": "application/text"}
            return (404, NOT_FOUND, headers) if value is None else (200, value, headers)

    def _wait(self, read: Callable[[], bytes | None], seen: str, timeout: float | None) -> bytes | None:
        """The value once its ETag differs from `seen`, or as it is when `timeout` seconds passed or the server
        closed. Called with the lock held."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            value = read()
            left = None if deadline is None else deadline - time.monotonic()
            if etag(value) != seen or self._closed or (left is not None and left <= 0):
                return value
            self._changed.wait(left)


def attribute_reader(attributes: Callable[[], Mapping[str, str]], key: str) -> Callable[[], bytes | None]:
    """A reader of one attribute of the current attributes (None while the key is missing)."""

    def read() -> bytes | None:
        value = attributes().get(key)
        return None if value is None else value.encode()

    return read
