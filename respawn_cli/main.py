"""The `respawn` command: submit, status, list, cancel, logs, parse-event, plan, doctor, and `local` (the local
cloud).

Readable tables by default, `--json` everywhere. Project, topic and bucket come
from flags or the environment (RESPAWN_PROJECT, RESPAWN_JOBS_TOPIC,
RESPAWN_STATE_BUCKET). Errors are one line on stderr: exit 2 for user errors,
1 when a cloud call failed; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from respawn.accounting import CATEGORIES, job_accounting
from respawn.bootstrap import job_store, jobs_publisher, log_reader
from respawn.deployment import VARIABLES, Settings, SettingsError
from respawn.jobs import Attempt, EndReason, Job, JobSpec, TpuMachine, machine_words

if TYPE_CHECKING:
    from respawn.spec import CancelRequest

PROG = "respawn"


class UserError(Exception):
    """Something the user can fix; printed as one line, exit 2."""


# ---- output helpers -------------------------------------------------------------------------------------------------


def when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t)) if t else "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if args.json else text)


def summary(job: Job) -> dict[str, Any]:
    current = job.current
    return {
        "job_id": job.job_id,
        "status": job.status.value,
        "attempts": len(job.attempts),
        "preemptions": job.counters.preemptions,
        "zone": current.zone if current else None,
        "updated_at": job.updated_at,
    }


def describe(job: Job, now: float | None = None) -> str:
    spec = job.spec
    lines = [
        f"job          {job.job_id}",
        f"status       {job.status.value}" + (f"  ({job.reason})" if job.reason else ""),
    ]
    if spec is not None:
        machine = spec.machine
        model = machine_words(machine)
        hosts = f", {machine.hosts} hosts per slice" if isinstance(machine, TpuMachine) and machine.hosts > 1 else ""
        hang = "off" if spec.hang_timeout_s is None else f"{spec.hang_timeout_s}s without progress"
        lines += [
            f"machine      {machine.kind} {model} ({spec.provisioning}{hosts})",
            f"hang after   {hang}",
            f"zones        {', '.join(spec.zones)}"
            if not spec.tiers
            else "tiers        "
            + "; ".join(
                f"{i}: {t.provisioning} in {', '.join(t.zones)}"
                + (f" on {machine_words(t.machine)}" if t.machine else "")
                for i, t in enumerate(spec.all_tiers)
            ),
            f"placement    {spec.placement}",
            f"checkpoints  {spec.checkpoint_uri}",
        ]
    lines += [f"submitted    {when(job.submitted_at)}", f"updated      {when(job.updated_at)}"]
    if spec is not None:
        lines.append(f"deadline     {when(job.deadline)}")
    if job.next_attempt_at:
        lines.append(f"next try     {when(job.next_attempt_at)} (capacity backoff, round {job.capacity_round})")
    counters = job.counters
    lines.append(
        f"counters     preemptions {counters.preemptions}, failures {counters.failures}, "
        f"capacity errors {counters.capacity_errors}"
    )
    if job.pending:
        actions = ", ".join(f"{a.get('kind')} {a.get('machine')}" for a in job.pending)
        lines.append(f"in flight    {actions} (lease until {when(job.pending_lease_until)})")
    if job.attempts:
        rows = [
            (a.n, a.zone, a.tier, a.machine, _runs_on(job, a), when(a.requested_at), _waited(a), when(a.started_at),
             when(a.ended_at), a.end_reason, a.restored_step, a.last_step)
            for a in job.attempts
        ]  # fmt: skip
        headers = ("#", "zone", "tier", "machine", "runs on", "requested", "waited", "started", "ended", "end",
                   "restored", "last step")  # fmt: skip
        lines += ["", "attempts", table(headers, rows)]
        skipped = [f"  {a.zone}  {a.error}" for a in job.attempts if a.end_reason == EndReason.UNOFFERED]
        if skipped:  # each zone that does not offer the machine, skipped from its first refusal on
            lines += ["", "skipped zones (they do not offer the machine)", *skipped]
        placed = [f"  {a.n}  {a.zone_reason}" for a in job.attempts if a.zone_reason]
        if placed:  # why each attempt went where it did (the outlook's figures, the runner-up)
            lines += ["", "placement", *placed]
        if spec is not None:
            accounting = job_accounting(job, time.time() if now is None else now)
            lines += ["", *_goodput_lines(accounting), "", "machine time by tier", _tier_costs(accounting)]
    if job.result:
        lines += ["", "result"]
        lines += [
            f"  {k:<13}{json.dumps(v, sort_keys=True) if isinstance(v, dict) else v}"
            for k, v in job.result.items()
            if k != "final_weights"
        ]
    if job.result.get("final_weights"):
        lines += ["", f"final weights  {job.result['final_weights']} (kept past the checkpoint bucket's retention)"]
    return "\n".join(lines)


def _runs_on(job: Job, a: Attempt) -> str:
    """The machine type attempt `a` ran on: its tier's machine (a tier may name its own), as machine_words says it."""
    return machine_words(job.spec.machine_of(a.tier)) if job.spec is not None else ""


def _waited(a: Attempt) -> str:
    """Request -> the trainer's process start: the queue, provisioning, boot and image pull."""
    if a.started_at is None:
        return ""
    return f"{max(0.0, a.started_at - (a.startup_s or 0.0) - a.requested_at):.0f}s"


def span(seconds: float) -> str:
    """12s, 4m05s, 3h12m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _goodput_lines(accounting: dict[str, Any]) -> list[str]:
    """Goodput, badput by category and cost at Spot vs on-demand (respawn/accounting.py, respawn/prices.py)."""
    seconds = accounting["seconds"]
    badput = ", ".join(f"{k.removesuffix('_s')} {span(seconds[k])}" for k in CATEGORIES if k != "productive_s")
    wall, productive = span(accounting["wall_s"]), span(seconds["productive_s"])
    lines = [
        f"goodput      {100 * accounting['goodput']:.1f}% of {wall}: productive {productive}",
        f"badput       {badput}",
    ]
    cost = accounting["cost"]
    if cost is None:
        lines.append("cost         - (no price for this machine type in respawn/prices.py)")
    else:
        less = f" ({100 * (1 - cost['spot_usd'] / cost['on_demand_usd']):.0f}% less)" if cost["on_demand_usd"] else ""
        lines.append(
            f"cost         ${cost['spot_usd']:.2f} at Spot vs ${cost['on_demand_usd']:.2f} on-demand{less} for "
            f"{accounting['machine_hours']:.2f} machine hours; {cost['priced_as']} [{cost['prices_as_of']}]"
        )
    return lines


def _tier_costs(accounting: dict[str, Any]) -> str:
    """Hours each tier's machines ran (from the trainer's process start to the attempt's end), priced at the
    Advice API's price where an attempt was placed with one, else at the tier's rate (Spot for spot/preemptible,
    on-demand otherwise; respawn/prices.py, dated list prices), and which prices those were."""
    rows = [
        (
            t["tier"],
            t["provisioning"],
            f"{t['machine_hours']:.2f}",
            "" if t["cost_usd"] is None else f"${t['cost_usd']:.2f}",
            "; ".join(t.get("price_sources", ())),
        )
        for t in accounting["tiers"]
    ]
    return table(("tier", "provisioning", "machine hours", "cost", "priced by"), rows)


# ---- settings and cloud clients ------------------------------------------------------------------------------------

_FLAGS = {"project": "--project", "state_bucket": "--bucket", "jobs_topic": "--topic"}


def settings(args: argparse.Namespace, *required: str) -> Settings:
    s = Settings.from_env()
    overrides = {k: getattr(args, k) for k in _FLAGS if getattr(args, k, None)}
    s = replace(s, **overrides)
    try:
        return s.require(*required)
    except SettingsError as e:
        missing = next(name for name in required if not getattr(s, name))
        raise UserError(f"{e} (or pass {_FLAGS[missing]})") from e


def publish(s: Settings, message: dict[str, Any]) -> str:
    publisher = jobs_publisher()
    topic = publisher.topic_path(s.project, s.jobs_topic)
    data = json.dumps(message, sort_keys=True).encode()
    return str(publisher.publish(topic, data, job_id=str(message.get("job_id", ""))).result(timeout=60))


# ---- subcommands ---------------------------------------------------------------------------------------------------


def job_spec(message: dict[str, Any]) -> JobSpec | CancelRequest:
    """The job message decoded (JobSpec or CancelRequest). A submit without `image` is checked as if it named the
    deployment's trainer image of its machine's kind, which the CLI does not know: it goes out without one, and the
    functions fill in the image RESPAWN_TRAINER_IMAGES names for that kind (or reject the job where it names none)."""
    from respawn.machine import DEPLOYMENT_IMAGES
    from respawn.spec import parse_job_message

    return parse_job_message(message, DEPLOYMENT_IMAGES)


def submit_spec(path: str, for_a_cancel: str) -> JobSpec:
    """The job file at `path` decoded as a submit message; UserError naming the file, or saying `for_a_cancel` when
    it holds a cancel."""
    from respawn.spec import SpecError
    from respawn_ops.jobfile import load_job_file

    try:
        spec = job_spec(load_job_file(path))
    except SpecError as e:
        raise UserError(f"{path}: {e}") from e
    if not isinstance(spec, JobSpec):
        raise UserError(f"{path}: {for_a_cancel}")
    return spec


def validated(message: dict[str, Any], source: str) -> dict[str, Any]:
    """The message, once the job spec decoder took it; a job naming respawn's trainer image of the other machine
    kind is warned about on stderr (it would fail at its trainer's start)."""
    from respawn.machine import image_mismatch
    from respawn.spec import SpecError

    try:
        spec = job_spec(message)
    except SpecError as e:
        raise UserError(f"{source}: {e}") from e
    if isinstance(spec, JobSpec) and (wrong := image_mismatch(spec.machine.kind, spec.image)):
        print(f"respawn: warning: {source}: {wrong}", file=sys.stderr)
    return message


def send(args: argparse.Namespace, message: dict[str, Any]) -> int:
    if args.dry_run:
        print(json.dumps(message, indent=None if args.json else 2, sort_keys=True))
        return 0
    s = settings(args, "project", "jobs_topic")
    message_id = publish(s, message)
    topic = f"projects/{s.project}/topics/{s.jobs_topic}"
    data = {"message_id": message_id, "job_id": message.get("job_id"), "topic": topic}
    emit(args, data, f"published {message.get('action', 'submit')} for {message.get('job_id')}: message {message_id}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from respawn.spec import SpecError
    from respawn_ops.jobfile import load_job_file

    try:
        message = load_job_file(args.file)
    except SpecError as e:
        raise UserError(f"{args.file}: {e}") from e
    message = validated(message, args.file)
    if not args.dry_run:
        check_zones(args.file, settings(args, "project", "jobs_topic"), message)
    return send(args, message)


def check_zones(source: str, s: Settings, message: dict[str, Any]) -> None:
    """Each of the job's zones asked whether it offers the job's machine (the APIs' machine and accelerator type
    listings): a warning for each that does not (respawn skips it) or could not be asked, and UserError when none
    offers it."""
    from respawn_cli.offering import OfferingLookup, machine_words

    spec = job_spec(message)
    assert isinstance(spec, JobSpec)
    try:
        lookup = OfferingLookup(s.project, tpu_endpoint=s.tpu_endpoint, compute_endpoint=s.compute_endpoint)
    except Exception as e:  # no credentials for the APIs: the job still goes; the functions skip such zones
        print(f"warning: zones: not checked against the machine type listings ({cloud_error(e)})", file=sys.stderr)
        return
    found = lookup.zones(spec)
    for o in found:
        if o.offered is not True:
            print(f"warning: zones: {o.detail}" + ("; respawn skips it" if o.offered is False else ""), file=sys.stderr)
    if all(o.offered is False for o in found):
        zones = ", ".join(dict.fromkeys(o.zone for o in found))
        machines = " or ".join(dict.fromkeys(machine_words(spec.machine_of(n)) for n in range(len(spec.all_tiers))))
        raise UserError(
            f"{source}: zones: none of {zones} offers {machines}; allowed: zones whose "
            "machine and accelerator type listings hold it (gcloud compute machine-types list --filter=NAME)"
        )


def cmd_cancel(args: argparse.Namespace) -> int:
    return send(args, validated({"action": "cancel", "job_id": args.job}, "cancel"))


def cmd_status(args: argparse.Namespace) -> int:
    if not args.job:
        return cmd_list(args)
    s = settings(args, "state_bucket")
    job, _ = job_store(s).load(args.job)
    if job is None:
        raise UserError(f"no job {args.job!r} in gs://{s.state_bucket}/respawn/jobs/")
    now = time.time()
    emit(args, {**job.to_dict(), "accounting": job_accounting(job, now)}, describe(job, now))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    s = settings(args, "state_bucket")
    store = job_store(s)
    jobs = [job for job, _ in (store.load(i) for i in store.list_ids()) if job is not None]
    rows = [summary(j) for j in sorted(jobs, key=lambda j: j.updated_at, reverse=True)]
    headers = ("job", "status", "attempts", "preemptions", "zone", "updated")
    cells = [
        [r["job_id"], r["status"], r["attempts"], r["preemptions"], r["zone"], when(r["updated_at"])] for r in rows
    ]
    text = table(headers, cells) if rows else "no jobs"
    emit(args, rows, text)
    return 0


def cmd_parse_event(args: argparse.Namespace) -> int:
    from respawn import parsing

    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {args.file}: {getattr(e, 'strerror', None) or e}") from e
    try:
        event = parsing.event_from_file(text)
    except ValueError as e:
        raise UserError(f"{args.file}: {e}") from e
    print(json.dumps(parsing.event_to_json(event), sort_keys=True))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """The job's trainer output and lifecycle entries: from Cloud Logging when a state bucket is configured (as
    `status` reads the job there), else (or with --local) from the local cloud's newest run of the job."""
    validated({"action": "cancel", "job_id": args.job}, "logs")  # the job id, checked as every message's is
    if args.attempt is not None and args.attempt < 1:
        raise UserError(f"--attempt: {args.attempt} is not an attempt; allowed: 1 or more")
    cloud = not args.local and bool(args.state_bucket or Settings.from_env().state_bucket)
    try:
        return _cloud_logs(args) if cloud else _local_logs(args)
    except KeyboardInterrupt:
        if args.follow:
            return 0  # Ctrl-C is how a follow ends
        raise


def _printer(args: argparse.Namespace, workers: bool) -> Callable[[Any], None]:
    def write(line: Any) -> None:
        text = json.dumps(line.to_json(), sort_keys=True, default=str) if args.json else line.render(workers)
        print(text, flush=args.follow)

    return write


def _cloud_logs(args: argparse.Namespace) -> int:
    from respawn_ops.joblogs import entry_line, job_filter, stream

    s = settings(args, "state_bucket", "project")
    store = job_store(s)
    job, _ = store.load(args.job)
    if job is None:
        raise UserError(f"no job {args.job!r} in gs://{s.state_bucket}/respawn/jobs/")
    since = job.submitted_at
    if args.attempt is not None:
        attempt = next((a for a in job.attempts if a.n == args.attempt), None)
        if attempt is None:
            raise UserError(f"--attempt: job {args.job} has no attempt {args.attempt}; it has {_attempt_range(job)}")
        since = attempt.requested_at
    hosts = job.spec.machine.hosts if job.spec else 1
    write = _printer(args, workers=hosts > 1)

    def out(entry: Any) -> None:
        line = entry_line(entry)
        if line is not None:
            write(line)

    def finished() -> bool:
        current, _ = store.load(args.job)
        return current is None or current.status.terminal

    selection = job_filter(s.project, args.job, args.attempt)
    stream(log_reader(s), selection, since, out, follow=args.follow, finished=finished, sleep=time.sleep)
    return 0


def _attempt_range(job: Job) -> str:
    return f"attempts 1-{len(job.attempts)}" if job.attempts else "no attempts"


def _local_logs(args: argparse.Namespace) -> int:
    from localcloud.readout import trainer_output

    workdir = Path(args.workdir)
    run = trainer_output.find_run(workdir, args.job)
    if run is None:
        raise UserError(
            f"no local run of job {args.job!r} in {workdir}/runs/ (for a job in Google Cloud, set "
            f"{VARIABLES['state_bucket'][0]} or pass --bucket)"
        )
    if (
        args.attempt is not None
        and args.attempt not in trainer_output.attempts(run, args.job)
        and trainer_output.run_over(run)
    ):
        known = trainer_output.attempts(run, args.job)
        have = f"attempts {', '.join(map(str, known))}" if known else "no attempts"
        raise UserError(f"--attempt: job {args.job} has no attempt {args.attempt} in {run}; it has {have}")
    print(f"{PROG}: {args.job} in {run}", file=sys.stderr)
    write = _printer(args, workers=True)  # a one-host machine's lines name no worker
    trainer_output.read(run, args.job, write, attempt=args.attempt, follow=args.follow, sleep=time.sleep)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """One self-contained HTML page of the job (respawn_ops/job_report.py): from its record and log entries when a state
    bucket is configured, else (or with --local) from the local cloud's newest run of the job."""
    validated({"action": "cancel", "job_id": args.job}, "report")
    out = Path(args.html or f"{args.job}.html")
    if not args.local and bool(args.state_bucket or Settings.from_env().state_bucket):
        from respawn_ops.job_report import from_record, page
        from respawn_ops.joblogs import job_filter, stream

        s = settings(args, "state_bucket", "project")
        job, _ = job_store(s).load(args.job)
        if job is None:
            raise UserError(f"no job {args.job!r} in gs://{s.state_bucket}/respawn/jobs/")
        entries: list[Any] = []
        stream(log_reader(s), job_filter(s.project, args.job), job.submitted_at, entries.append, sleep=time.sleep)
        out.write_text(page(from_record(job, entries, time.time())), encoding="utf-8")
    else:
        from localcloud.readout import html_report, trainer_output

        run = trainer_output.find_run(Path(args.workdir), args.job)
        if run is None or not (run / "report.json").exists():
            raise UserError(f"no finished local run of job {args.job!r} in {args.workdir}/runs/ (no report.json)")
        html_report.write(run, json.loads((run / "report.json").read_text()), out)
    print(str(out))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Each tier and zone of a job file as respawn would place it (respawn_cli/plan.py): the history from the state
    bucket when one is set and readable, the Advice API's figures for a GPU job's Spot tiers; nothing is created."""
    from respawn.outlook import Outlook
    from respawn.policy import Policy
    from respawn_cli import plan

    spec = submit_spec(args.file, "a cancel message has no placement; plan takes a submit message")
    s = Settings.from_env()
    s = replace(s, **{k: getattr(args, k) for k in ("project", "state_bucket") if getattr(args, k, None)})
    now = time.time()
    history, history_note, where = _plan_history(s)
    outlook = Outlook(history, _plan_advice(s, spec), note=history_note)
    built = plan.build(spec, outlook, now, history=where, restart_cost_s=Policy().restart_cost_s)
    emit(args, plan.to_json(built), plan.text(built, table))
    return 0


def _plan_history(s: Settings) -> tuple[Any, str | None, str]:
    """(the deployment's history, the outlook's note when it is empty for want of one, where it came from): from the
    state bucket when one is set and readable, else an empty history, saying why."""
    from respawn.bootstrap import history_store
    from respawn.histories import current
    from respawn.outlook import History

    if not s.state_bucket:
        why = f"no history: {VARIABLES['state_bucket'][0]} is not set (or pass --bucket); an empty history"
        return History(), why, why
    where = f"gs://{s.state_bucket}/placement/history.json"
    try:
        history, generation, pending = current(history_store(s))
    except Exception as e:  # unreadable: the plan still shows the advice and the prices
        why = f"no history: {where} could not be read ({cloud_error(e)}); an empty history"
        return History(), why, why
    if generation == 0 and not pending:
        return history, None, f"{where} not written yet (no attempt has ended): an empty history"
    folding = f", {pending} observations not folded in yet" if pending else ""
    return history, None, f"{where} (generation {generation}, {len(history.exposures)} zone/machine keys{folding})"


def _plan_advice(s: Settings, spec: Any) -> dict[tuple[str, str], Any]:
    """What the Advice API says for each provisioning model of the job's tiers (adapters.advice.advice_for). A
    missing project or client: a note, no call."""
    from respawn.outlook import Advice

    if not s.project:
        note = f"Advice API not asked: {VARIABLES['project'][0]} is not set (or pass --project); history only"
    else:
        try:
            from respawn.adapters.advice import GcpAdvisor, advice_for

            return advice_for(GcpAdvisor(s.compute_endpoint), s.project, spec)
        except Exception as e:  # no credentials: plan still prints the history's figures
            note = f"Advice API not asked: {cloud_error(e)}; history only"
    now = time.time()
    return {(spec.machine.type_name, tier.provisioning): Advice({}, now, note) for tier in spec.all_tiers}


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the deployment (and a job file) against its project before anything is spent (respawn_cli/doctor/): one
    line per check, pass, warn or fail, every failure naming its fix. Exit 0 only when nothing fails."""
    import os

    from respawn_cli.doctor import report

    spec = (
        submit_spec(args.file, "a cancel message needs no machine; doctor takes a submit message")
        if args.file
        else None
    )
    s = settings(args, "project", "state_bucket")
    orchestrator = os.environ.get("RESPAWN_ORCHESTRATOR_SERVICE_ACCOUNT", "").strip() or None
    d = report.deployment(s, orchestrator)
    lines = []
    try:
        for line in report.run(d, s.status_topic or "respawn-status", spec):
            lines.append(line)
            if not args.json:
                print(line.text(), flush=True)
    finally:
        d.clients.close()
    if args.json:
        print(json.dumps([line.to_json() for line in lines], indent=2))
    else:
        counts = {k: sum(line.status == k for line in lines) for k in ("pass", "warn", "fail")}
        print(f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed")
    return 1 if report.failed(lines) else 0


def run_local(argv: list[str]) -> int:
    try:
        local_cli = importlib.import_module("localcloud.command")
    except ModuleNotFoundError as e:
        if e.name in ("localcloud", "localcloud.command"):
            raise UserError(
                "the local cloud is not part of this installation (module localcloud.command is missing)"
            ) from e
        raise UserError(f"the local cloud needs the Python package {e.name!r}: pip install -r requirements.txt") from e
    main_fn: Callable[[list[str]], int | None] = local_cli.main
    return int(main_fn(argv) or 0)


# ---- argument parsing ----------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Keep training jobs alive on Spot / preemptible TPUs and GPUs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print JSON instead of text")
    project = argparse.ArgumentParser(add_help=False)
    project.add_argument("--project", help=f"Google Cloud project (env {VARIABLES['project'][0]})")
    topic = argparse.ArgumentParser(add_help=False)
    topic.add_argument("--topic", dest="jobs_topic", help="jobs topic (env RESPAWN_JOBS_TOPIC, default respawn-jobs)")
    topic.add_argument("--dry-run", action="store_true", help="print the message instead of publishing it")
    bucket = argparse.ArgumentParser(add_help=False)
    bucket.add_argument("--bucket", dest="state_bucket", help="state bucket (env RESPAWN_STATE_BUCKET)")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str, *parents: Any) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, parents=[out, *parents])
        sp.set_defaults(fn=fn)
        return sp

    add("submit", cmd_submit, "validate a job file (JSON or YAML) and publish it", project, topic).add_argument(
        "file", help="job file"
    )
    add("status", cmd_status, "show one job (or list all jobs)", project, bucket).add_argument("job", nargs="?")
    add("list", cmd_list, "list jobs", project, bucket)
    add("cancel", cmd_cancel, "cancel a job (its machine is deleted)", project, topic).add_argument("job")
    add("parse-event", cmd_parse_event, "show how respawn reads a LogEntry / Pub/Sub message file").add_argument(
        "file", help="a LogEntry, Pub/Sub message, push body or CloudEvent (JSON)"
    )
    logs = add(
        "logs",
        cmd_logs,
        "print a job's trainer output and lifecycle entries, attempt by attempt (Cloud Logging when a state "
        "bucket is configured, else the local cloud's newest run of the job)",
        project,
        bucket,
    )
    logs.add_argument("job")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    logs.add_argument("--attempt", type=int, metavar="N", help="only attempt N")
    logs.add_argument("--local", action="store_true", help="read the local cloud's runs even with a bucket set")
    logs.add_argument("--workdir", default=".respawn", help="the local cloud's workdir (default .respawn)")
    report = add(
        "report",
        cmd_report,
        "write one self-contained HTML page of a job: attempts by zone with preemptions, notices and head starts, "
        "the training step, the goodput split, cost against on-demand, placement reasons",
        project,
        bucket,
    )
    report.add_argument("job")
    report.add_argument("--html", metavar="FILE", help="where to write the page (default JOB.html)")
    report.add_argument("--local", action="store_true", help="read the local cloud's runs even with a bucket set")
    report.add_argument("--workdir", default=".respawn", help="the local cloud's workdir (default .respawn)")
    add(
        "plan",
        cmd_plan,
        "show how respawn would place a job file: each tier and zone with its expected time to interruption, "
        "goodput, cost per productive hour, the source of each figure, and the order respawn would try them",
        project,
        bucket,
    ).add_argument("file", help="job file")
    add(
        "doctor",
        cmd_doctor,
        "check the deployment, and a job file, against the project before anything is spent: APIs, the accounts' "
        "permissions, network and firewall, buckets, image, topics, organisation policies, zones and quota; "
        "exit 0 only when nothing fails",
        project,
        bucket,
    ).add_argument("file", nargs="?", help="job file (optional)")
    sub.add_parser("local", help="run jobs on the local cloud (respawn local --help)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "local":
            return run_local(argv[1:])
        args = parser().parse_args(argv)
        return int(args.fn(args))
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a cloud call failed: one line, no traceback
        print(f"{PROG}: error: {cloud_error(e)}", file=sys.stderr)
        return 1


def cloud_error(e: Exception) -> str:
    from google.auth.exceptions import DefaultCredentialsError

    if isinstance(e, DefaultCredentialsError):
        return "no Google Cloud credentials found: run `gcloud auth application-default login`"
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text[:300]}"


if __name__ == "__main__":
    sys.exit(main())
