"""respawn's log-based metrics, read from their one source and evaluated over LogEntries as Cloud Logging would.

`respawn_ops/log_metrics.json` holds every metric: its name (`logging.googleapis.com/user/NAME` in Cloud
Monitoring), its filter (the shared `scope` AND its own `where`), its value extractor for a distribution and its
label extractors. Terraform deploys them from that file (infra/terraform/monitoring.tf, `google_logging_metric`);
the local cloud and the tests evaluate the very same filters here, with the sink's filter evaluator, over the
entries a run really wrote, so a test shows that each metric counts what it claims.

Extractors, as Cloud Logging has them: ``EXTRACT(field)`` and ``REGEXP_EXTRACT(field, "regex")`` (the regex's one
capture group). A distribution's entry whose value is missing or not a number adds nothing, as in Cloud Logging.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from respawn_ops.logfilter import LogFilter  # the sink's evaluator: keep this the one import of it here

SOURCE = resources.files("respawn_ops") / "log_metrics.json"
_EXTRACT = re.compile(
    r'^(?P<fn>EXTRACT|REGEXP_EXTRACT)\((?P<field>[A-Za-z0-9_.]+)(?:,\s*"(?P<regex>(?:[^"\\]|\\.)*)")?\)$'
)


class ExtractorError(ValueError):
    """An extractor this evaluator (and Cloud Logging) does not accept."""


@dataclass(frozen=True)
class Extractor:
    path: tuple[str, ...]
    regex: re.Pattern[str] | None

    @staticmethod
    def parse(text: str, where: str) -> Extractor:
        m = _EXTRACT.match(text.strip())
        if m is None or (m["fn"] == "REGEXP_EXTRACT") != (m["regex"] is not None):
            raise ExtractorError(
                f"{where}: {text!r} is not an extractor; allowed: EXTRACT(field.path) or "
                'REGEXP_EXTRACT(field.path, "regex with one (group)")'
            )
        regex = re.compile(m["regex"].replace('\\"', '"')) if m["regex"] is not None else None
        if regex is not None and regex.groups != 1:
            raise ExtractorError(f"{where}: {text!r}: the regular expression needs exactly one capture group")
        return Extractor(tuple(m["field"].split(".")), regex)

    def __call__(self, entry: Mapping[str, Any]) -> str | None:
        value: Any = entry
        for key in self.path:
            if not isinstance(value, Mapping) or key not in value:
                return None
            value = value[key]
        if value is None or isinstance(value, Mapping | list):
            return None
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        if self.regex is None:
            return text
        found = self.regex.search(text)
        return found[1] if found else None


@dataclass(frozen=True)
class LogMetric:
    name: str
    display_name: str
    description: str
    filter: LogFilter
    unit: str
    value: Extractor | None  # None: a counter (one per matching entry)
    labels: dict[str, Extractor]

    @property
    def type(self) -> str:
        """Its metric type in Cloud Monitoring."""
        return f"logging.googleapis.com/user/{self.name}"

    def evaluate(self, entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The series this metric makes of `entries`: one per label set, {labels, count[, values]} (values: the
        distribution's, in entry order), ordered by labels."""
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for entry in entries:
            if not self.filter.matches(entry):
                continue
            value = None
            if self.value is not None:
                value = _number(self.value(entry))
                if value is None:
                    continue
            labels = tuple((k, extract(entry) or "") for k, extract in sorted(self.labels.items()))
            row = series.setdefault(labels, {"labels": dict(labels), "count": 0})
            row["count"] += 1
            if value is not None:
                row.setdefault("values", []).append(value)
        return [series[k] for k in sorted(series)]


def definitions() -> dict[str, Any]:
    """The metrics file as Terraform reads it."""
    loaded: dict[str, Any] = json.loads(SOURCE.read_text(encoding="utf-8"))
    return loaded


def full_filter(scope: str, where: str) -> str:
    """A metric's filter, composed exactly as infra/terraform/monitoring.tf composes it."""
    return f"{scope} AND ({where})"


def metrics() -> list[LogMetric]:
    doc = definitions()
    found = []
    for d in doc["metrics"]:
        where = f"log metric {d['name']}"
        found.append(
            LogMetric(
                name=d["name"],
                display_name=d["display_name"],
                description=d["description"],
                filter=LogFilter.parse(full_filter(doc["scope"], d["where"])),
                unit=d["unit"],
                value=Extractor.parse(d["value_extractor"], where) if "value_extractor" in d else None,
                labels={k: Extractor.parse(v, f"{where}, label {k}") for k, v in d["labels"].items()},
            )
        )
    return found


def evaluate(entries: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every metric's series over `entries`: {metric name: series}."""
    entries = list(entries)
    return {m.name: m.evaluate(entries) for m in metrics()}


def total(series: list[dict[str, Any]], **labels: str) -> int:
    """How many entries a metric counted in the series whose labels hold `labels`."""
    return sum(s["count"] for s in series if _holds(s, labels))


def values(series: list[dict[str, Any]], **labels: str) -> list[float]:
    """A distribution's values in the series whose labels hold `labels`."""
    return [x for s in series if _holds(s, labels) for x in s.get("values", ())]


def _holds(series: dict[str, Any], labels: Mapping[str, str]) -> bool:
    return all(series["labels"].get(k) == v for k, v in labels.items())


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
