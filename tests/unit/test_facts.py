"""Facts for Cloud Monitoring: each logged once, by the handler whose compare-and-set wrote it, whatever the
deliveries; and the log-based metrics (respawn_ops/log_metrics.json) count them as the functions' entries in Cloud Run.

A job through two preemptions and a completion on the in-memory fakes, every event delivered three times (and one
five times at once); the service's log lines are read back as Cloud Run makes entries of them."""

from __future__ import annotations

import json
import logging

import pytest
from fakes import FakeClock, FakeProvider, InMemoryJobStore, deliver_concurrently

from localcloud.readout.function_entries import _entry
from respawn.events import JobSubmitted, MachinePreempted, SweepTicked, TrainerCompleted, TrainerStarted
from respawn.facts import facts, waiting
from respawn.jobs import JobSpec, MachineState, Status, TpuMachine
from respawn.service import Service
from respawn_ops import log_metrics

A, B = "us-central1-a", "us-west4-a"
T0 = 1_000_000.0
SPEC = JobSpec(
    job_id="llm",
    machine=TpuMachine("v5litepod-8", "v2-alpha-tpuv5-lite"),
    zones=(A, B),
    image="us-docker.pkg.dev/p/r/trainer:1",
    checkpoint_uri="gs://b/runs/llm",
)


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    parsed = [json.loads(r.getMessage()) for r in caplog.records if r.name in ("respawn.service", "respawn.facts")]
    return [p for p in parsed if isinstance(p, dict)]


def run_job(caplog: pytest.LogCaptureFixture) -> tuple[InMemoryJobStore, list[dict[str, object]]]:
    store, provider, clock = InMemoryJobStore(), FakeProvider(), FakeClock(T0)

    def service() -> Service:
        return Service(store, {"tpu": provider}, clock)

    def thrice(event: object) -> None:
        for _ in range(3):
            service().handle(event)  # type: ignore[arg-type]

    caplog.set_level(logging.INFO, logger="respawn")
    thrice(JobSubmitted("submit-1", T0, SPEC))
    for n in (1, 2):
        clock.advance(5)
        thrice(TrainerStarted(f"started-{n}", clock.now(), "llm", n))
        clock.advance(60)
        provider.set_state(f"llm-a{n}", MachineState.PREEMPTED)
        event = MachinePreempted(f"preempted-{n}", clock.now(), "llm", n, f"llm-a{n}", A, "p")
        if n == 1:
            deliver_concurrently([service().handle for _ in range(5)], event)
        else:
            thrice(event)
        service().handle(SweepTicked(f"tick-{n}", clock.now()))  # a gauge: a repeated tick repeats it
    clock.advance(7)
    thrice(TrainerStarted("started-3", clock.now(), "llm", 3))
    clock.advance(30)
    thrice(TrainerCompleted("completed-3", clock.now(), "llm", 3, 800))
    return store, lines(caplog)


def test_each_fact_is_logged_once_whatever_the_deliveries(caplog: pytest.LogCaptureFixture) -> None:
    store, logged = run_job(caplog)
    found = [
        (f["fact"], f.get("attempt"), f.get("status")) for f in logged if "fact" in f and f["fact"] != "job_waiting"
    ]
    assert found == [
        ("job_status", None, "PROVISIONING"),
        ("job_status", None, "RUNNING"),
        ("attempt_started", 1, None),
        ("job_status", None, "RECOVERING"),
        ("attempt_ended", 1, None),
        ("job_status", None, "RUNNING"),
        ("attempt_started", 2, None),
        ("recovered", 2, None),
        ("job_status", None, "RECOVERING"),
        ("attempt_ended", 2, None),
        ("job_status", None, "RUNNING"),
        ("attempt_started", 3, None),
        ("recovered", 3, None),
        ("job_status", None, "SUCCEEDED"),
        ("attempt_ended", 3, None),
        ("job_ended", None, "SUCCEEDED"),
    ]
    job = store.job("llm")
    assert job.status is Status.SUCCEEDED and job.counters.preemptions == 2


def test_the_metrics_count_what_the_record_says(caplog: pytest.LogCaptureFixture) -> None:
    store, logged = run_job(caplog)
    job = store.job("llm")
    entries = [_entry(json.dumps(line), "respawn-on-event", "p") for line in logged]
    entries.append(_entry("Traceback (most recent call last):", "respawn-on-event", "p"))  # text: counts nothing
    m = log_metrics.evaluate(entries)
    assert log_metrics.total(m["respawn/preemptions"]) == job.counters.preemptions == 2
    assert log_metrics.total(m["respawn/preemptions"], zone=A, machine="v5litepod-8", provisioning="spot") == 2
    assert log_metrics.total(m["respawn/job_status"], status="SUCCEEDED") == 1
    assert log_metrics.total(m["respawn/job_status"], status="RECOVERING", job_id="llm") == 2
    assert log_metrics.total(m["respawn/failures"]) == log_metrics.total(m["respawn/stockouts"]) == 0
    a = {x.n: x for x in job.attempts}
    assert (
        log_metrics.values(m["respawn/recovery_duration"])
        == [
            pytest.approx(a[2].started_at - a[1].ended_at),
            pytest.approx(a[3].started_at - a[2].ended_at),
        ]
        == [5.0, 7.0]
    )
    assert log_metrics.values(m["respawn/job_goodput"], job_id="llm") == [
        pytest.approx(facts(None, job, 0)[-1]["goodput"])
    ]
    hours = log_metrics.values(m["respawn/machine_hours"], job_id="llm")
    assert len(hours) == 3 and sum(hours) == pytest.approx(facts(None, job, 0)[-1]["machine_hours"], abs=1e-5)
    spot, on_demand = sum(log_metrics.values(m["respawn/cost"])), sum(log_metrics.values(m["respawn/on_demand_cost"]))
    assert 0 < spot < on_demand
    assert log_metrics.total(m["respawn/progress_age"]) == 2  # the two sweeps that found the job live
    assert log_metrics.total(m["respawn/function_errors"]) == log_metrics.total(m["respawn/function_retries"]) == 0


def test_errors_and_retries_are_counted_by_function() -> None:
    error = _entry(json.dumps({"severity": "ERROR", "message": "x", "job_id": "j"}), "respawn-on-event", "p")
    retry = _entry(
        json.dumps({"severity": "WARNING", "event": "trainer_started", "result": "retry"}),
        "respawn-on-job-message",
        "p",
    )
    other = {**error, "resource": {"type": "gce_instance", "labels": {}}}  # not a function's: outside the scope
    m = log_metrics.evaluate([error, retry, other])
    assert m["respawn/function_errors"] == [{"labels": {"function": "respawn-on-event"}, "count": 1}]
    assert log_metrics.total(m["respawn/function_retries"], function="respawn-on-job-message") == 1


def test_a_live_job_waiting_grows_its_progress_age_and_an_ended_one_has_none() -> None:
    from respawn.jobs import Job

    job = Job("llm", SPEC, Status.PENDING, submitted_at=T0, updated_at=T0)
    assert waiting(job, T0 + 90) == {
        "fact": "job_waiting",
        "job_id": "llm",
        "machine": "v5litepod-8",
        "provisioning": "spot",
        "status": "PENDING",
        "progress_s": 90.0,
    }
    from dataclasses import replace

    assert waiting(replace(job, status=Status.FAILED), T0 + 90) is None


@pytest.mark.parametrize(
    "text", ["EXTRACT(jsonPayload.x", "REGEXP_EXTRACT(jsonPayload.x)", 'REGEXP_EXTRACT(jsonPayload.x, "a")', "x"]
)
def test_a_bad_extractor_is_refused_naming_the_metric(text: str) -> None:
    with pytest.raises(log_metrics.ExtractorError, match=r"^m: .*allowed|capture group"):
        log_metrics.Extractor.parse(text, "m")


def test_regexp_extract_takes_its_group() -> None:
    extract = log_metrics.Extractor.parse(r'REGEXP_EXTRACT(resource.labels.zone, "^([a-z]+-[a-z]+[0-9]+)-")', "m")
    assert extract({"resource": {"labels": {"zone": "us-central1-a"}}}) == "us-central1"
    assert extract({"resource": {}}) is None


# -- the job report of a deployed job: its record (and log entries) --------------------------------------------------


def test_a_deployed_jobs_page_shows_its_records_figures(caplog: pytest.LogCaptureFixture) -> None:
    from respawn.accounting import job_accounting
    from respawn_ops.job_report import from_record, page, read_figures

    store, _ = run_job(caplog)
    job = store.job("llm")
    entries = [
        {"timestamp": "1970-01-12T13:46:45Z", "jsonPayload": {"event": "progress", "step": 10, "job_id": "llm"}},
        {"timestamp": "1970-01-12T13:47:45Z", "jsonPayload": {"event": "checkpoint", "step": 20, "job_id": "llm"}},
    ]
    text = page(from_record(job, entries, T0 + 1000))
    figures = read_figures(text)
    books = job_accounting(job, T0 + 1000)
    assert figures["status"] == "SUCCEEDED" and figures["attempts"] == "3" and figures["preemptions"] == "2"
    assert figures["goodput"] == f"{100 * books['goodput']:.1f}%"
    assert float(figures["split.lost_s"]) == books["seconds"]["lost_s"] == 120.0
    assert float(figures["cost.on_demand_usd"]) == pytest.approx(books["cost"]["on_demand_usd"], abs=5e-5)
    assert text.count('class="attempt"') == 3 and text.count('data-kind="preemption"') == 2
    assert "<script" not in text and "polyline" in text  # the steps of the entries
