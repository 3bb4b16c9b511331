"""Recovery latency on the local cloud: >= 10 preemptions of one job, measured end to end.

Runs `respawn local run` (the whole local cloud: Pub/Sub, functions-framework, the local TPU API, trainer
processes) on a small LM job preempted every `--every` training steps (the same run on a fast or a slow
machine), and reads its report:

  create      preemption (machine PREEMPTED, system event emitted) -> the replacement's create call at the API
  first step  preemption -> the first training step of the replacement trainer (persistent compilation cache)
              (with a head start the replacement is requested before the PREEMPTED mark, or the noticed machine is
              deleted at its final save and never marked: both are then measured from the notice, local/report.py)
  goodput     productive training time / wall time of the whole run (harsh: one preemption every --every steps)

With --mtbi SECONDS every machine lives a seeded random time instead (the local cloud's --mtbi: every 10
machines live 10 x MTBI in all; SPEC 7: goodput under local chaos with MTBI 60 s >= 92%), and the job runs
--steps however many preemptions that gives. `make bench` runs 9000 steps: 10 x 60 s of training at the
tiny model's ~15 steps/s, one round of 10 machine lifetimes, so the run sees about the rate it asked for;
"mtbi_realized_s" (READY seconds per preemption) says what it saw. The goodput run keeps the trainer's
default checkpoint interval, as a user's job would (Young/Daly at the default MTBI: local preemptions come
with their notice and lose nothing); the fixed schedule saves every 50 steps.

With --hosts 4 the job is examples/compute-slice.yaml's 4-host TPU slice (v6e-16: 4 trainer processes on
loopback, 4 CPU devices each, the nano model), run once through each API side by side: `tpu`, the Cloud TPU API
(a queued resource; every preemption takes the whole node and stops all 4 workers), and `compute`, Compute Engine
(a workload policy, an instance template and a MIG of 4 VMs; every preemption takes one VM, whose worker gets the
notice and the others stop with it). Either way the replacement slice starts 4 new workers, which must all come up
(JAX's coordinator) before the first new step. `--api tpu|compute|both` picks (both by default with --hosts 4;
tpu with --hosts 1, examples/quickstart.yaml's v5e; compute with --hosts 1 is a v6e-8 Compute Engine instance).

With --profile NAME every machine takes a profile's times for each step of a recovery (localcloud/machines/profiles.py):
`cloud` replays Spot TPU and GPU recoveries from public figures at 1/60 speed, so that a local second reads as a
real minute; `cloud-baked` and `cloud-nocache` show what a boot image holding Docker and the trainer image, and the
persistent compilation cache, save. Each API's run then prints the recovery from the notice, split into its steps
(detect, queue, create, boot, install, pull, start: localcloud/readout/recovery_split.py), in local seconds and in the
real-cloud minutes they stand for; goodput at a realistic MTBI (--mtbi-hours, scaled the same way), modelled from
the measured recoveries and lost work (the job's periodic checkpoints left out: recovery_split.goodput_at); and,
per trainer process, the programs compiled after the first attempt's first step (0: every restart of every process
read its program from the persistent compilation cache). --head-start sets the job option head_start (a head start
on the notice), off without it; `--head-start both` runs each API twice, without and with, in columns side by side
("compute", "compute head start"; the last line's top-level figures are then the head start's). A respawn whose job
message has no such option runs without, and refuses --head-start saying so.

Targets (SPEC section 7): create p95 < 0.5 s, first step p50 < 2.5 s; a 4-host local slice: first step p50 < 8 s.
The last line printed is one JSON object {"create_p50_s", "create_p95_s", "first_step_p50_s",
"first_step_p95_s", "split_p50_s" (create / queue / boot / trainer start), "goodput", "lost_steps_per_preemption",
"hosts", "api", ..., "profile", "scale", "notice_first_step_p50_s", "notice_first_step_p95_s",
"notice_split_p50_s", "real_min" (those three in real-cloud minutes), "mtbi_h", "goodput_at_mtbi",
"programs_compiled_on_restart", "apis": {API: the same figures of that API's run}}; the top-level figures are those
of the API the job takes by default (compute for v6e, tpu for the quickstart's v5e), or of the one API run.

    .venv/bin/python bench/bench_recovery.py [--preemptions 12] [--every 100] [--steps 1500] [--plot FILE.png]
    .venv/bin/python bench/bench_recovery.py --mtbi 60 --steps 9000
    .venv/bin/python bench/bench_recovery.py --hosts 4      # per API: 10 preemptions of a 4-host slice, every 30 steps
    .venv/bin/python bench/bench_recovery.py --hosts 4 --api compute --preemptions 3 --steps 120
    .venv/bin/python bench/bench_recovery.py --profile cloud --preemptions 3 --steps 500
    .venv/bin/python bench/bench_recovery.py --profile cloud-baked --hosts 4 --preemptions 2 --steps 120
    .venv/bin/python bench/bench_recovery.py --profile cloud --head-start both --preemptions 4 --steps 600
    .venv/bin/python bench/bench_recovery.py --profile cloud --head-start both --hosts 4 --api compute --preemptions 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from localcloud.machines.profiles import PROFILES, profile, real_minutes
from localcloud.readout.recovery_split import PHASES, goodput_at, programs_written, recoveries, summary
from respawn.machine import NOTICE_S
from respawn.spec import SpecError, parse_job_message

ROOT = Path(__file__).resolve().parents[1]
APIS = ("tpu", "compute")
HEAD_STARTS = ("on", "off", "both")
HEAD_START_COLUMN = " head start"  # the column of a run with the head start, beside one without
W = 20  # a column of the side-by-side tables: one per run ("compute head start")
# The Cloud TPU API's software version for v6e (https://cloud.google.com/tpu/docs/runtimes): the v6e-16 slice
# through queued resources, the same job as Compute Engine's MIG but for the API.
V6E_RUNTIME = "v2-alpha-tpuv6e"
# The rows of the side-by-side table: (label, key of the figures, format).
ROWS = (
    ("preemption -> first step p50", "first_step_p50_s", "{:.2f}s"),
    ("preemption -> first step p95", "first_step_p95_s", "{:.2f}s"),
    ("preemption -> create call p50", "create_p50_s", "{:.3f}s"),
    ("preemption -> create call p95", "create_p95_s", "{:.3f}s"),
    ("goodput", "goodput", "{:.4f}"),
    ("lost steps per preemption", "lost_steps_per_preemption", "{:.2f}"),
    ("preemptions", "preemptions", "{}"),
    ("exact", "exact", "{}"),
    ("status", "status", "{}"),
)


def job_of(hosts: int, api: str) -> dict[str, Any]:
    """The job a run measures: a 4-host v6e-16 slice (examples/compute-slice.yaml) through either API, or one host:
    the quickstart's v5e through the Cloud TPU API, a v6e-8 instance through Compute Engine."""
    if hosts > 1:
        job = yaml.safe_load((ROOT / "examples" / "compute-slice.yaml").read_text())
        if api == "tpu":
            machine = job["machine"]
            job["machine"] = {
                "kind": "tpu",
                "accelerator_type": machine["accelerator_type"],
                "api": "tpu",
                "runtime_version": V6E_RUNTIME,
            }
        return dict(job)
    job = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    if api == "compute":  # in the slice's zones: the quickstart's offer v5e, not v6e (localcloud/apis/offerings.py)
        job["machine"] = {"kind": "tpu", "accelerator_type": "v6e-8", "api": "compute"}
        job["zones"] = yaml.safe_load((ROOT / "examples" / "compute-slice.yaml").read_text())["zones"]
    return dict(job)


def figures(
    r: dict[str, Any], hosts: int, api: str, events: list[dict[str, Any]], workdir: str, mtbi_h: float
) -> dict[str, Any]:
    """What the last JSON line says of one run: the run report's figures, then the recovery from the notice."""
    return {
        "create_p50_s": r["recovery_create_p50_s"],
        "create_p95_s": r["recovery_create_p95_s"],
        "first_step_p50_s": r["recovery_first_step_p50_s"],
        "first_step_p95_s": r["recovery_first_step_p95_s"],
        "split_p50_s": r["recovery_split_p50_s"],  # create, queue (queued resource), boot, trainer start
        "goodput": r["goodput"],
        "preemptions": r["preemptions"],
        "mtbi_realized_s": r["mtbi_realized_s"],
        "lost_steps": r["lost_steps"],
        "lost_steps_per_preemption": r["lost_steps"] / max(r["preemptions"], 1),
        "exact": r["exact"],
        "status": r["status"],
        "hosts": r.get("hosts", hosts),
        "api": api,
        **from_the_notice(r, events, workdir, mtbi_h),
    }


def from_the_notice(r: dict[str, Any], events: list[dict[str, Any]], workdir: str, mtbi_h: float) -> dict[str, Any]:
    """The recovery from the notice split into its steps, in local seconds and the real minutes they stand for;
    goodput at the profile's MTBI, modelled from it; the programs each process compiled after the first step."""
    timings = r["timings"]
    scale = float(timings["scale"])
    rows = recoveries(events)
    s = summary(rows)
    split = s["split_p50_s"]
    after_ready = [sum(row[k] for k in ("boot_s", "install_s", "pull_s", "start_s")) for row in rows]
    wasted = r["goodput_s"]["wasted_s"]
    first_step = next((e["t"] for e in sorted(events, key=lambda e: e["t"]) if e["kind"] == "step"), None)
    cache = Path(workdir) / "compile-cache"
    compiled = programs_written(cache, first_step, int(r.get("hosts", 1))) if first_step is not None else {}
    return {
        "profile": timings["profile"],
        "scale": scale,
        "notice_first_step_p50_s": s["first_step_p50_s"],
        "notice_first_step_p95_s": s["first_step_p95_s"],
        "notice_split_p50_s": split,
        "gap_p50_s": s["gap_p50_s"],
        "after_notice_p50_s": s["after_notice_p50_s"],
        "real_min": {
            "notice_first_step_p50": _minutes(s["first_step_p50_s"], scale),
            "notice_first_step_p95": _minutes(s["first_step_p95_s"], scale),
            "notice_split_p50": {k: _minutes(v, scale) for k, v in split.items()},
            "gap_p50": _minutes(s["gap_p50_s"], scale),
            "after_notice_p50": _minutes(s["after_notice_p50_s"], scale),
        },
        "mtbi_h": mtbi_h,
        "goodput_at_mtbi": None
        if not rows
        else goodput_at(
            mtbi_h * 3600 * scale,
            s["gap_p50_s"] or 0.0,
            sorted(after_ready)[(len(after_ready) - 1) // 2],
            wasted / max(r["preemptions"], 1),
            s["after_notice_p50_s"] or 0.0,
        ),
        "programs_compiled_on_restart": compiled,
    }


def _minutes(local_s: float | None, scale: float) -> float | None:
    return None if local_s is None else real_minutes(local_s, scale)


def timeline(run_dir: str) -> list[dict[str, Any]]:
    path = Path(run_dir) / "timeline.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_one(a: argparse.Namespace, api: str, job: dict[str, Any], plot: str) -> dict[str, Any] | None:
    """`respawn local run` of the job with the schedule; its report, or None when it printed none."""
    steps = ",".join(str(a.every * (i + 1)) for i in range(a.preemptions))
    with tempfile.TemporaryDirectory() as tmp:
        job_file = Path(tmp) / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        argv = [sys.executable, "-m", "respawn_cli.main", "local", "run", str(job_file)]
        argv += ["--mtbi", f"{a.mtbi:g}s", "--seed", str(a.seed)] if a.mtbi else ["--preempt-at-step", steps]
        argv += ["--json", "--plot", plot, "--workdir", a.workdir, "--timeout", "40m", "--profile", a.profile]
        print(f"running ({api}):", " ".join(argv[1:]), file=sys.stderr, flush=True)
        proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if not proc.stdout.strip():
        print(f"the {api} run printed no report (exit code {proc.returncode})", file=sys.stderr)
        return None
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"api {api}:")
    for row in r["recovery"]:
        print(
            f"{row['machine']:>32} stop {row['stop_s'] or 0:6.2f}s  create {row['create_s'] or 0:6.3f}s  "
            f"queue {row['queue_s'] or 0:6.3f}s  boot {row['boot_s'] or 0:6.2f}s  "
            f"trainer start {row['start_s'] or 0:6.2f}s  first step {row['first_step_s'] or 0:6.2f}s"
        )
    print(
        f"hosts {r.get('hosts', 1)}, status {r['status']}, exact {r['exact']}, attempts {r['attempts']}, "
        f"preemptions {r['preemptions']} (realized MTBI {r['mtbi_realized_s'] or 0:.1f}s), "
        f"lost steps {r['lost_steps']}, wall {r['wall_s']:.0f}s, bus {r['bus']}, plot {r.get('plot')}"
    )
    print("goodput split (s):", json.dumps(r["goodput_s"]))
    return r


def notice_table(by_api: dict[str, dict[str, Any]]) -> str:
    """The recovery from the notice per API: each step's p50, in local seconds and in real-cloud minutes."""
    apis = list(by_api)
    first = by_api[apis[0]]
    scale = first["scale"]
    lines = [
        f"profile {first['profile']} (1 local s = {1 / scale / 60:g} real min): from the notice, p50 (s / min)",
        f"  {profile(first['profile']).description}",
        f"{'':36}" + "".join(f"{api:>{W}}" for api in apis),
    ]
    labels = {"first_step": "notice -> first step", "after_notice": "trained after the notice", "gap": "no training"}
    for key in (*PHASES, "first_step", "after_notice", "gap"):
        cells = []
        for api in apis:
            f = by_api[api]
            if key in PHASES:
                local, real = f["notice_split_p50_s"][key], f["real_min"]["notice_split_p50"][key]
            else:
                local = f["notice_first_step_p50_s"] if key == "first_step" else f[f"{key}_p50_s"]
                real = f["real_min"][f"notice_{key}_p50" if key == "first_step" else f"{key}_p50"]
            cells.append("-" if local is None else f"{local:.2f}s / {real:.1f}m")
        label = labels.get(key) or f"  {key.removesuffix('_s')}"
        lines.append(f"{label:36}" + "".join(f"{c:>{W}}" for c in cells))
    goodput = ["-" if by_api[a]["goodput_at_mtbi"] is None else f"{by_api[a]['goodput_at_mtbi']:.4f}" for a in apis]
    mtbi = f"goodput at MTBI {first['mtbi_h']:g} h ({first['mtbi_h'] * 3600 * scale:.0f}s)"
    lines.append(f"{mtbi:36}" + "".join(f"{c:>{W}}" for c in goodput))
    compiled = [
        ",".join(str(n) for _, n in sorted(by_api[a]["programs_compiled_on_restart"].items())) or "-" for a in apis
    ]
    lines.append(f"{'programs compiled on restart p0,p1..':36}" + "".join(f"{c:>{W}}" for c in compiled))
    return "\n".join([*lines, *head_start_gains(by_api)])


def head_start_gains(by_api: dict[str, dict[str, Any]]) -> list[str]:
    """With `--head-start both`: per API, how much sooner the first step comes with the head start (p50 from the
    notice), beside the notice window it overlaps (a TPU's 10 s, respawn/machine.py: the bench's jobs are TPUs)."""
    lines = []
    for column, on in by_api.items():
        name = column.removesuffix(HEAD_START_COLUMN)
        off = by_api.get(name)
        if column == name or off is None:
            continue
        saved = (off["notice_first_step_p50_s"] or 0.0) - (on["notice_first_step_p50_s"] or 0.0)
        window = NOTICE_S["tpu"] * on["scale"]
        lines.append(
            f"head start ({name}): the first step {saved:.2f}s / {real_minutes(saved, on['scale']):.1f}m sooner, "
            f"{saved / window:.1f} x the notice window ({window:.2f}s / {NOTICE_S['tpu']} real s)"
        )
    return lines


def head_start_option(job: dict[str, Any]) -> str | None:
    """Why the job cannot ask for a head start, or None when it can: the job option `head_start` must be one the
    job message knows (the head start on the notice, issue 24 item 2)."""
    try:
        parse_job_message({**job, "head_start": True})
    except SpecError as e:
        return f"the job message has no option head_start ({e})"
    return None


def table(by_api: dict[str, dict[str, Any]]) -> str:
    """The APIs' figures side by side, one column per API."""
    apis = list(by_api)
    lines = [f"{'':36}" + "".join(f"{api:>{W}}" for api in apis)]
    for label, key, fmt in ROWS:
        cells = ["-" if by_api[api][key] is None else fmt.format(by_api[api][key]) for api in apis]
        lines.append(f"{label:36}" + "".join(f"{c:>{W}}" for c in cells))
    parts = ("create_s", "queue_s", "boot_s", "start_s")
    split = ["/".join(f"{by_api[api]['split_p50_s'][k] or 0:.1f}" for k in parts) for api in apis]
    lines.append(f"{'split p50 s create/queue/boot/start':36}" + "".join(f"{c:>{W}}" for c in split))
    return "\n".join(lines)


def plot_path(given: str | None, workdir: str, slice_job: bool, api: str, several: bool) -> str:
    """The run's timeline PNG: the one given (with `_API` added when several APIs run), else in the workdir,
    named as before for the quickstart through the Cloud TPU API."""
    if given:
        return str(Path(given).with_suffix("")) + f"_{api}.png" if several else given
    tag = ("_4hosts" if slice_job else "") + ("" if api == "tpu" and not slice_job else f"_{api}")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return str(Path(workdir) / f"bench_recovery{tag}_timeline.png")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=1, choices=(1, 4), help="1: quickstart.yaml; 4: compute-slice.yaml")
    p.add_argument(
        "--api", choices=(*APIS, "both"), help="the API the machines go through (both with --hosts 4, else tpu)"
    )
    p.add_argument("--preemptions", type=int, help="scheduled preemptions (default 12; 10 with --hosts 4)")
    p.add_argument("--every", type=int, help="training steps between scheduled preemptions (100; 30 with --hosts 4)")
    p.add_argument("--steps", type=int, help="training steps, more than preemptions x every (1500; 360 with --hosts 4)")
    p.add_argument("--mtbi", type=float, help="seconds: seeded random machine lifetimes instead of the fixed schedule")
    p.add_argument("--seed", type=int, default=7, help="seed of --mtbi")
    p.add_argument("--model", help="the trainer's model (tiny; nano with --hosts 4)")
    p.add_argument(
        "--plot",
        default=None,
        help="the timeline PNG (default WORKDIR/bench_recovery[_4hosts][_API]_timeline.png; with both APIs, "
        "_API is added before .png)",
    )
    p.add_argument("--workdir", default=str(ROOT / ".respawn"))
    p.add_argument(
        "--profile",
        default="local",
        choices=list(PROFILES),
        help="recovery timings (localcloud/machines/profiles.py): local, or real-cloud figures a minute to a second",
    )
    p.add_argument("--mtbi-hours", type=float, help="MTBI for the modelled goodput, real hours (the profile's: 8)")
    p.add_argument(
        "--head-start",
        nargs="?",
        const="on",
        default="off",
        choices=HEAD_STARTS,
        help="the job's head_start on the notice: on (the flag alone), off (without the flag), or both: each API "
        "runs twice, without and with, side by side",
    )
    p.add_argument(
        "--preemption-notice",
        metavar="DURATION",
        help="the job's preemption_notice (a Spot VM's metadata notice before its soft off, e.g. 2m; real time, "
        "scaled like the profile's figures): Compute Engine machines only",
    )
    a = p.parse_args()
    mtbi_h = a.mtbi_hours or profile(a.profile).mtbi.real_s / 3600
    slice_job = a.hosts > 1
    a.preemptions = a.preemptions or (10 if slice_job else 12)
    a.every = a.every or (30 if slice_job else 100)
    total = a.steps or (360 if slice_job else 1500)
    model = a.model or ("nano" if slice_job else "tiny")
    chosen = a.api or ("both" if slice_job else "tpu")
    apis = list(APIS) if chosen == "both" else [chosen]
    default_api = "compute" if slice_job else "tpu"  # what the job takes without `api` (v6e-16; the v5e quickstart)

    problem = head_start_option(job_of(a.hosts, apis[0]))
    if problem and a.head_start != "off":
        print(f"bench_recovery: --head-start: not available yet: {problem}", file=sys.stderr)
        return 2
    head_starts = [False, True] if a.head_start == "both" else [a.head_start == "on"]
    by_api: dict[str, dict[str, Any]] = {}
    ok = True
    for api, head_start in [(api, h) for api in apis for h in head_starts]:
        column = api + (HEAD_START_COLUMN if head_start and len(head_starts) > 1 else "")
        job = job_of(a.hosts, api)
        job["job_id"] = f"bench-recovery{'-slice' if slice_job else ''}{'' if api == 'tpu' else '-compute'}"
        job["args"] = [f"--model={model}", f"--steps={total}", "--log-every=1"]
        if slice_job:  # a global batch over the slice's 16 devices; checkpoints as often as the single-host run's
            job["args"] += ["--batch-size=16", "--checkpoint-every=10"]
        elif not a.mtbi:  # chaos (goodput) runs the trainer's default interval, as a user's job does
            job["args"] += ["--checkpoint-every=50"]
        if not problem:  # a respawn with the option: on with --head-start only, so that runs compare
            job["head_start"] = head_start
        if a.preemption_notice:
            job["preemption_notice"] = a.preemption_notice
        tag = api + ("_head_start" if head_start and len(head_starts) > 1 else "")
        plot = plot_path(a.plot, a.workdir, slice_job, tag, len(apis) * len(head_starts) > 1)
        r = run_one(a, column, job, plot)
        if r is None:
            ok = False
            continue
        by_api[column] = {
            **figures(r, a.hosts, api, timeline(r["run_dir"]), a.workdir, mtbi_h),
            "head_start": head_start,
        }
        wanted = min(10, a.preemptions)
        if r["preemptions"] < wanted and not a.mtbi:
            print(
                f"{column}: only {r['preemptions']} preemptions: raise --steps so the job outlasts the schedule",
                file=sys.stderr,
            )
        ok = ok and r["status"] == "SUCCEEDED" and bool(a.mtbi or r["preemptions"] >= wanted)
    if not by_api:
        return 1
    print(table(by_api))
    print(notice_table(by_api))
    top = by_api.get(default_api + (HEAD_START_COLUMN if len(head_starts) > 1 else "")) or next(iter(by_api.values()))
    print(json.dumps({**top, "apis": by_api}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
