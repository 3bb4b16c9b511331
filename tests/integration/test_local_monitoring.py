"""A local run through two preemptions with every message delivered three times: each log-based metric, evaluated
over the entries the run's functions really wrote, counts what the run's report says; and the run's HTML report,
rendered by a real headless Chromium, shows the timeline and the report's figures.

Chromium is Debian's `chromium` package (.ci/run installs it; so does `apt-get install chromium`). Without it the
browser test skips, and fails under RESPAWN_REQUIRE_EMULATORS=1 (CI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import need

from localcloud.readout.function_entries import function_entries
from localcloud.services.emulators import FakeGcs
from respawn_ops import log_metrics
from respawn_ops.job_report import read_figures

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    need(FakeGcs.missing())
    workdir = tmp_path_factory.mktemp("respawn-monitoring")
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    job.update(job_id="mon-it", args=["--model=tiny", f"--steps={STEPS}", "--checkpoint-every=20", "--log-every=1"])
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    argv = [sys.executable, "-m", "respawn_cli.main", "local", "run", str(path), "--preempt-at-step", "60,140"]
    argv += ["--creation-delay", "0.5s", "--sweep-every", "2s", "--duplicate-deliveries", "3", "--no-reference"]
    argv += ["--json", "--workdir", str(workdir)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.stdout.strip(), done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == "SUCCEEDED", done.stderr[-4000:]
    report["_workdir"] = str(workdir)
    return report


def test_each_metric_counts_what_the_report_says(run: dict[str, Any]) -> None:
    run_dir = Path(run["run_dir"])
    entries = function_entries(run_dir)
    m = log_metrics.evaluate(entries)
    assert json.loads(Path(run["metrics"]).read_text()) == m  # the run wrote the same beside its report
    # every event went three times: the handled lines say so, the metrics count each fact once
    handled = [e for e in entries if (e.get("jsonPayload") or {}).get("result") == "duplicate"]
    assert len(handled) >= 10, "the duplicate deliveries did not happen"
    assert log_metrics.total(m["respawn/preemptions"]) == run["preemptions"] == 2
    assert log_metrics.total(m["respawn/preemptions"], zone=run["zones"][0]["zone"], provisioning="spot") >= 1
    assert log_metrics.total(m["respawn/job_status"], status="SUCCEEDED", job_id="mon-it") == 1
    assert log_metrics.total(m["respawn/job_status"], status="RECOVERING") == 2
    assert log_metrics.total(m["respawn/failures"]) == run["failures"] == 0
    assert log_metrics.total(m["respawn/stockouts"]) == run["capacity_errors"] == 0
    # recovery, per attempt recovered: from the control plane's end of the preempted attempt (on its notice, with
    # the head start) to the new trainer's `started` entry. The report's runs from the cloud's notice to the new
    # trainer's first step: the metric is never more; and never less than the new machine's queue and boot, since
    # the attempt was ended before its successor's create call went out.
    recovery = next(x for x in log_metrics.metrics() if x.name == "respawn/recovery_duration")
    recovered = {
        e["jsonPayload"]["attempt"]: e["jsonPayload"]["recovery_s"] for e in entries if recovery.filter.matches(e)
    }
    attempt_of = {f"mon-it-a{z['attempt']}": z["attempt"] for z in run["zones"]}
    rows = {attempt_of[r["machine"]] + 1: r for r in run["recovery"]}
    assert sorted(recovered) == sorted(rows) == [2, 3]
    assert sorted(recovered.values()) == sorted(log_metrics.values(m["respawn/recovery_duration"]))
    assert recovered == {int(n): s for n, s in run["recovered_s"].items()}  # the report's own figure, exactly
    for n, row in rows.items():
        assert row["queue_s"] + row["boot_s"] <= recovered[n] <= row["first_step_s"], (n, recovered, row)
    assert len(log_metrics.values(m["respawn/job_goodput"], job_id="mon-it")) == 1
    hours = log_metrics.values(m["respawn/machine_hours"], job_id="mon-it")
    assert len(hours) == run["attempts"] and sum(hours) > 0
    assert 0 < sum(log_metrics.values(m["respawn/cost"])) < sum(log_metrics.values(m["respawn/on_demand_cost"]))
    assert log_metrics.total(m["respawn/function_errors"]) == 0


# ------------------------------------------------------------------------------------------------ the page


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found:
        return found
    problem = "Chromium is not installed: apt-get install chromium (.ci/run installs it)"
    if os.environ.get("RESPAWN_REQUIRE_EMULATORS") == "1" or os.environ.get("CI") == "true":
        pytest.fail(problem)
    pytest.skip(problem)


def headless(*args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,1700"]
    return subprocess.run([chromium(), *flags, *args], capture_output=True, text=True, timeout=120)


def test_the_report_page_renders_in_chromium_with_the_reports_figures(run: dict[str, Any], tmp_path: Path) -> None:
    page = Path(run["html"])
    assert page.parent == Path(run["run_dir"]) and page.exists()
    text = page.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained
    dom = headless("--dump-dom", page.as_uri())
    assert dom.returncode == 0 and "<svg" in dom.stdout, dom.stderr[-2000:]
    f = read_figures(dom.stdout)
    attempts = [
        dict(re.findall(r'(data-[a-z]+)="([^"]*)"', tag))
        for tag in re.findall(r'<rect class="attempt"[^>]*>', dom.stdout)
    ]
    marks = re.findall(r'<path class="mark" data-kind="([a-z]+)"', dom.stdout)
    assert f["job_id"] == "mon-it" and f["status"] == run["status"]
    assert int(f["attempts"]) == run["attempts"] and int(f["preemptions"]) == run["preemptions"] == 2
    assert f["goodput"] == f"{100 * run['goodput']:.1f}%"
    assert f["wall_s"] == f"{run['wall_s']:.1f}"  # the page shows one decimal
    assert int(f["final_step"]) == run["final_step"] == STEPS
    for key, seconds in run["goodput_s"].items():
        if key == "total_s":  # the trainers' own total, not a category
            continue
        assert float(f[f"split.{key}"]) == pytest.approx(seconds, abs=0.0005), key
    assert float(f["cost.actual_usd"]) == pytest.approx(run["cost"]["spot_usd"], abs=5e-5)
    assert float(f["cost.on_demand_usd"]) == pytest.approx(run["cost"]["on_demand_usd"], abs=5e-5)
    assert [int(a["data-attempt"]) for a in attempts] == [z["attempt"] for z in run["zones"]]
    assert [a["data-end"] for a in attempts] == [z["end"] or "" for z in run["zones"]]
    assert marks.count("notice") == run["preemptions_injected"] == 2
    for z in run["zones"]:
        assert f[f"placement.a{z['attempt']}"] == (z["placement"] or "list order")
    shot = tmp_path / "report.png"
    done = headless(f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]
    keep = os.environ.get("RESPAWN_REPORT_SCREENSHOT")  # to look at it
    if keep:
        shutil.copy(shot, keep)


def test_respawn_report_writes_the_same_page_for_the_local_run(run: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "mon-it.html"
    argv = [sys.executable, "-m", "respawn_cli.main", "report", "mon-it", "--local", "--workdir", run["_workdir"]]
    done = subprocess.run([*argv, "--html", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(out), done.stderr
    assert out.read_text() == Path(run["html"]).read_text()
    missing = subprocess.run([*argv[:4], "no-such-job", *argv[5:]], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 2 and "no finished local run of job 'no-such-job'" in missing.stderr, missing.stderr
