"""The deployment's preemption history as the service keeps it: observations written one object each, read merged
with the history object, and folded into that object by the sweep.

No object takes every ended attempt. An ended attempt's observation is its own
object, named by its id (`JOB/N`) and written create-only, so a duplicate
delivery or a redelivery after a crash writes nothing twice. The history that
placement reads is the history object plus every observation not folded into
it yet, merged in memory (`History.record`: a duplicate counts nothing, any
order counts the same). The sweep folds them in: one compare-and-set write of
the history object, then the folded objects deleted. The history remembers the
ids it counted, so a crash between that write and the deletes counts nothing
twice: the next fold finds the ids counted and only deletes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from respawn.jobs import JobSpec
from respawn.outlook import SEEN_MAX, Advice, History, Observation, Outlook
from respawn.ports import ConflictError, HistoryStore, TransientError

# What Google's Advice API says for a job's machines, per (machine type, provisioning model) of its tiers: built by
# bootstrap around the Advisor adapter, which answers GPU machine types only, caches and never raises.
AdviceSource = Callable[[JobSpec], Mapping[tuple[str, str], Advice]]

# Observations one fold counts at most. The history remembers SEEN_MAX ids, so an observation counted and left
# undeleted by a failed delete stays recognised through at least one more fold (which deletes it again).
FOLD_MAX = SEEN_MAX // 2


def current(store: HistoryStore) -> tuple[History, int, int]:
    """(the history placement reads: the history object with every pending observation merged in, the object's
    generation, how many pending observations there were)."""
    history, generation = store.load()
    pending = store.pending()
    return history.record(pending), generation, len(pending)


class Histories:
    """The deployment's preemption history: read for decide through an in-process cache, written from observations.

    Every decision that may place a machine reads it; a history a minute old ranks zones as well as a fresh one, so
    reads are cached `cache_s` (60 s). A read that fails gives an outlook without history and a note saying why (the
    zones then rank on no data: list order, the penalty aside): a store hiccup never fails an event."""

    def __init__(
        self, store: HistoryStore, *, advice: AdviceSource | None = None, cache_s: float = 60.0, tries: int = 5
    ) -> None:
        self.store, self.advice, self.cache_s, self.tries = store, advice, cache_s, tries
        self._cached: tuple[float, Outlook] | None = None

    def outlook(self, now: float, *, read: bool = True, spec: JobSpec | None = None) -> Outlook:
        """The outlook of the history as of at most `cache_s` ago, with the Advice API's word on `spec`'s machines
        when there is an advice source; without `read`, whatever history is cached and no advice (no I/O)."""
        history = self._history(now, read)
        if not read or spec is None or self.advice is None:
            return history
        return replace(history, advice=self.advice(spec))

    def _history(self, now: float, read: bool) -> Outlook:
        if self._cached is not None and (not read or now - self._cached[0] < self.cache_s):
            return self._cached[1]
        if not read:
            return Outlook(History(), note="the preemption history was not read for this event")
        try:
            history, _ = self.store.load()
        except Exception as e:  # any failure to read: rank on no data and say so, never fail the event
            outlook = Outlook(History(), note=f"preemption history unreadable ({type(e).__name__}: {e}); no data")
        else:
            try:
                outlook = Outlook(history.record(self.store.pending()))
            except Exception as e:  # the folded history alone, at most a sweep period behind
                note = f"observations not yet folded into the preemption history unreadable ({type(e).__name__}: {e})"
                outlook = Outlook(history, note=note)
        self._cached = (now, outlook)
        return outlook

    def record(self, observations: Sequence[Mapping[str, Any]], now: float) -> None:
        """Write the observations, one object each (create-only: one written before is left as it is), and count them
        in the cached history at once. Raises TransientError when the store fails for now; anything else it raises."""
        parsed = [Observation.from_dict(o) for o in observations]
        self.store.add(parsed)
        if self._cached is not None:
            at, outlook = self._cached
            self._cached = (at, replace(outlook, history=outlook.history.record(parsed)))

    def fold(self) -> int:
        """Fold the pending observations (at most FOLD_MAX not yet counted, oldest ids first) into the history object
        under compare-and-set (a conflict: reload and again, `tries` times), then delete their objects, and those of
        any counted before. Returns how many were deleted. Raises TransientError when the store keeps failing or
        changing; anything else the store raises."""
        pending = self.store.pending()
        if not pending:
            return 0
        for _ in range(self.tries):
            history, generation = self.store.load()
            counted = set(history.seen)
            fresh = [o for o in pending if o.id not in counted][:FOLD_MAX]
            new = history.record(fresh)
            if new is not history:
                try:
                    self.store.save(new, generation)
                except ConflictError:
                    continue
            folded = [o.id for o in pending if o.id in counted] + [o.id for o in fresh]
            self.store.drop(folded)
            return len(folded)
        raise TransientError(f"the preemption history kept changing under {self.tries} tries")
