"""`respawn local run JOB.yaml [options]`: one job through the whole system on this machine, with chaos.

Prints live progress and, at the end, the report (`--json`: one JSON object on
stdout, progress on stderr). Exit code 0 when the job SUCCEEDED with the exact
parameters of the uninterrupted reference run (a world of several slices that
trained some steps on other members: data-exact; or with exactness unknown: no
reference, or no params_sha256 to compare) and nothing was left behind,
1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localcloud import chaos
from localcloud.chaos import ChaosError, check_workers, parse_duration
from localcloud.machines import slices
from localcloud.machines.profiles import Profile, Timings, profile
from localcloud.machines.slices import LocalSlice, local_trainer_env
from localcloud.services import secret_store
from localcloud.services.secret_store import SecretError, secret_values
from respawn.jobs import JobSpec

if TYPE_CHECKING:
    from localcloud.cloud import Options, Outcome

EPILOG = """\
chaos times (--preempt-at) count from the moment the job message is published; a preemption
that falls when no machine is READY waits for the next machine to become READY.
--preempt-at-step preempts the READY machine once its trainer reports the step: the same
run on a fast or a slow machine.
--mtbi gives every machine a random lifetime from READY (seeded; every 10 machines live 10 x MTBI in all);
ZONE=DURATION pairs give each zone named its own (--mtbi us-central1-a=20s,us-central1-c=5m; a zone not named
is not interrupted, unless a plain DURATION beside the pairs covers it).
A preemption takes the whole machine, but of a Compute Engine slice (a MIG, each worker its own VM) one VM,
drawn with --seed: its worker gets the notice, the VM is TERMINATED and logs the event, respawn deletes the MIG.
worker chaos (STEP:WORKER, comma-separated) hits one worker of a TPU slice once worker 0 of the READY
node reports STEP: --kill-worker-at-step SIGKILLs it (its startup script logs `failed`),
--hang-worker-at-step SIGSTOPs it (only hang detection, the job's hang_timeout, finds it),
--host-error-at-step is a host error of its VM (TERMINATED: a TPU node whole, a MIG's VM alone; hostError event,
process killed).
Step actions fire in step order, each once, each on a node no earlier step action hit.
--entrypoint runs your own program on every machine (every worker of a slice) instead of the image's
`python -m trainer`, with the job's args after it, the same environment, signals and log routing; no image
is pulled. A leading `python` or `python3` is the interpreter running respawn (with its JAX). A program that
sends no lifecycle entries completes, stops and fails by its exit code (docs/trainer-protocol.md).
secrets: a job's `secrets` are references; give each a value here with --secret NAME=VALUE,
--secret NAME (the value of NAME in this environment: nothing on the command line) or
--secrets-file FILE (NAME=VALUE lines), NAME being the job's variable. Values reach the trainers'
environments only; the report's `secrets` says how many trainers held them and which files, under
--workdir or on fake-gcs-server, hold one (none, or the run fails).
examples:
  respawn local run examples/quickstart.yaml --preempt-at 40s,80s
  respawn local run examples/quickstart.yaml --preempt-at-step 150,300
  respawn local run examples/slice.yaml --preempt-at-step 30 --kill-worker-at-step 70:2 \
      --hang-worker-at-step 110:1 --host-error-at-step 150:3
  respawn local run job.yaml --mtbi 60s --seed 7 --stockout us-central1-a:1 --plot timeline.png
  respawn local run examples/three-zones.yaml --mtbi us-central1-a=20s,us-south1-a=20s,us-west4-a=5m --seed 5
  respawn local run job.yaml --duplicate-deliveries 3 --trainer-arg=--steps=60 --json
  respawn local run examples/byo/job.yaml --entrypoint "python examples/byo/train.py" --preempt-at-step 40
"""


class UsageError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    """`respawn local`'s commands. The flags of `run`, in help order: the wings register theirs (chaos.py, the
    secrets' services/secret_store.py, the machines' environment machines/slices.py), the run's own are here, each
    group beside the code that reads it."""
    p = argparse.ArgumentParser(prog="respawn local", description="Run jobs on the local cloud.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run one job to the end through real preemptions and print the report",
        description="Run one job on the local cloud (fake-gcs-server, Pub/Sub, functions-framework, the local "
        "TPU/Compute API, a log router and a sweep scheduler), inject preemptions, print the report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("job", help="job file (YAML or JSON, the job message of SPEC 3.1)")
    for add_flags in (
        chaos.add_flags,
        add_pace_flags,
        add_program_flags,
        secret_store.add_flags,
        add_data_flags,
        add_reference_flags,
        slices.add_flags,
        add_output_flags,
    ):
        add_flags(run)
    return p


def add_pace_flags(run: argparse.ArgumentParser) -> None:
    """The recovery profile and the figures that replace its own (read by `timing_options`), the notice window, the
    sweep period and the run's timeout (read by `pace_options`)."""
    run.add_argument(
        "--profile",
        default="local",
        metavar="NAME",
        help="the recovery timings: local (default), or real-cloud figures scaled to a second a minute: cloud, "
        "cloud-baked, cloud-nocache (localcloud/machines/profiles.py); the options below replace one of its figures",
    )
    run.add_argument(
        "--creation-delay",
        metavar="DURATION",
        help="time a machine spends CREATING before READY (the profile's; local: 1s)",
    )
    run.add_argument("--boot-delay", metavar="DURATION", help="READY -> the machine's startup script runs")
    run.add_argument(
        "--docker-install",
        metavar="DURATION",
        help="the machine boots without Docker and its startup script installs it in this time",
    )
    run.add_argument("--image-pull", metavar="DURATION", help="a docker pull of the image a machine lacks")
    run.add_argument("--image-refresh", metavar="DURATION", help="a docker pull of the image a machine has")
    run.add_argument(  # on top of the local trainer's own start
        "--trainer-start-delay",
        metavar="DURATION",
        help="docker run -> the trainer's process starts (runtime init, a real compile and restore)",
    )
    run.add_argument(
        "--grace",
        default="30s",
        metavar="DURATION",
        help=(
            "preemption notice window: the VM is off this long after the notice (default 30s, as on Compute"
            " Engine); the shutdown script stops the trainer within its machine kind's grace (8s TPU, 25s GPU)"
        ),
    )
    run.add_argument("--sweep-every", default="5s", metavar="DURATION", help="sweep tick period (default 5s; 0 = off)")
    run.add_argument("--timeout", default="30m", metavar="DURATION", help="give up after this long (default 30m)")


@dataclass(frozen=True)
class TimingOptions:
    """The recovery profile and the timing options given, parsed before the job file is read; `for_job` applies
    them to the job's machine (its kind, API and boot image decide the steps)."""

    profile: Profile
    creation_delay_s: float | None
    machine: dict[str, Any]

    def for_job(self, message: dict[str, Any]) -> Timings:
        from localcloud.cloud import TRAINER_IMAGES
        from respawn.spec import parse_job_message

        spec = parse_job_message(message, TRAINER_IMAGES)
        assert isinstance(spec, JobSpec)  # load_message allows submit only
        base = self.profile.timings(spec.machine)
        creation = base.creation_delay_s if self.creation_delay_s is None else self.creation_delay_s
        return replace(base, creation_delay_s=creation, machine=replace(base.machine, **self.machine))


def timing_options(ns: argparse.Namespace) -> TimingOptions:
    """--profile and the options that replace one of its figures."""
    try:
        chosen = profile(ns.profile)
    except ValueError as e:
        raise UsageError(str(e)) from None
    given = {
        field: parse_duration(text, option)
        for field, option, text in (
            ("boot_s", "--boot-delay", ns.boot_delay),
            ("docker_install_s", "--docker-install", ns.docker_install),
            ("image_pull_s", "--image-pull", ns.image_pull),
            ("image_refresh_s", "--image-refresh", ns.image_refresh),
            ("trainer_start_s", "--trainer-start-delay", ns.trainer_start_delay),
        )
        if text is not None
    }
    creation = parse_duration(ns.creation_delay, "--creation-delay") if ns.creation_delay is not None else None
    return TimingOptions(chosen, creation, given)


def pace_options(ns: argparse.Namespace) -> dict[str, Any]:
    """The local cloud's options (cloud.Options fields) the notice window, the sweep period and the timeout set."""
    return {
        "grace_s": parse_duration(ns.grace, "--grace"),
        "sweep_every_s": parse_duration(ns.sweep_every, "--sweep-every"),
        "timeout_s": parse_duration(ns.timeout, "--timeout"),
    }


def add_program_flags(run: argparse.ArgumentParser) -> None:
    """What the machines run: the trainer's flags (read by `load_message`) or a program of one's own (`options`)."""
    run.add_argument(
        "--trainer-arg",
        action="append",
        default=[],
        metavar="--FLAG=VALUE",
        help="set one trainer flag, replacing the job's own (e.g. --trainer-arg=--steps=60); repeatable",
    )
    run.add_argument(
        "--entrypoint",
        metavar="CMD",
        help="run this command (shell-quoted; the job's args follow) on every machine instead of the image's "
        '`python -m trainer`; a leading python/python3 is this interpreter (e.g. "python train.py")',
    )


def with_trainer_args(args: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """Replace (or append) `--name=value` flags in the job's args."""
    out = list(args)
    for flag in overrides:
        name, eq, _ = flag.partition("=")
        if not name.startswith("--") or not eq:
            raise UsageError(f"--trainer-arg: {flag!r} is not --FLAG=VALUE")
        out = [a for a in out if a.partition("=")[0] != name]
        out.append(flag)
    return out


def parse_entrypoint(text: str) -> list[str]:
    """`--entrypoint "python train.py --x=1"` -> argv, a leading python/python3 replaced by this interpreter."""
    allowed = 'allowed: a command line such as "python train.py --lr=0.1"'
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--entrypoint: cannot split {text!r}: {str(e).lower()}; {allowed}") from None
    if not argv:
        raise UsageError(f"--entrypoint: {text!r} holds no command; {allowed}")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def total_steps(args: Sequence[str]) -> int | None:
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name == "--steps":
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            return int(value) if value.isdigit() else None
    return None


def load_message(path: str, overrides: Sequence[str], own_program: bool = False) -> dict[str, Any]:
    """The validated job message; its args must be the trainer's flags unless `own_program` runs instead."""
    from localcloud.cloud import TRAINER_IMAGES
    from respawn.spec import SpecError, parse_job_message
    from respawn_ops.jobfile import load_job_file

    try:
        message = load_job_file(path)
        if overrides:
            message["args"] = with_trainer_args(message.get("args") or [], overrides)
        parse_job_message(message, TRAINER_IMAGES)  # without `image`: the local functions' image of its kind
    except SpecError as e:
        raise UsageError(f"{path}: {e}") from e
    if message.get("action", "submit") != "submit":
        raise UsageError(f"{path}: action must be submit to run a job locally")
    if own_program:  # the args are the program's own
        return message
    import subprocess

    from localcloud.machines.vms import TRAINER_FLAG_CHECK

    # the local cloud runs the trainer itself (not the image): its flags must be the trainer's, as it checks them
    check = subprocess.run([*TRAINER_FLAG_CHECK, *(message.get("args") or [])], capture_output=True, text=True)
    if check.returncode != 0:
        raise UsageError(f"{path}: args: {check.stderr.strip()}")
    return message


def add_data_flags(run: argparse.ArgumentParser) -> None:
    """Data copied to the local GCS before the job (`parse_upload`) and the folder a run writes in (`options`)."""
    run.add_argument(
        "--upload",
        action="append",
        default=[],
        metavar="DIR=gs://BUCKET/PREFIX",
        help="copy DIR's files to the local GCS before the job (and its reference run) starts: a dataset; repeatable",
    )
    run.add_argument(
        "--workdir", default=".respawn", help="run logs, compile cache, reference cache (default .respawn)"
    )


def parse_upload(text: str) -> tuple[Path, str]:
    directory, _, uri = text.partition("=")
    if not Path(directory).is_dir() or not uri.startswith("gs://") or not uri[5:].split("/")[0]:
        raise UsageError(f"--upload {text!r}: allowed DIR=gs://BUCKET/PREFIX with DIR an existing directory")
    return Path(directory), uri


@contextlib.contextmanager
def uploaded(uploads: list[tuple[Path, str]]) -> Iterator[tuple[dict[str, str], str]]:
    """For the reference run: the environment of a fake-gcs-server of its own holding the uploads (none without
    them), and the folder its cached result goes in, named by the uploads' digest (other data, another result)."""
    if not uploads:
        yield {}, ""
        return
    from localcloud.services.emulators import FakeGcs

    digest = hashlib.sha256()
    for directory, uri in uploads:
        digest.update(uri.encode())
        for path in sorted(p for p in directory.iterdir() if p.is_file()):
            digest.update(path.name.encode() + hashlib.sha256(path.read_bytes()).digest())
    with FakeGcs() as gcs:
        for directory, uri in uploads:
            gcs.upload(directory, uri)
        yield gcs.env(), f"data-{digest.hexdigest()[:16]}"


def job_slice(machine: dict[str, Any]) -> LocalSlice:
    """The processes a job's validated `machine` runs as: a TPU slice's from its accelerator type, a GPU machine's
    from its vms and GPUs."""
    gpus = machine.get("accelerator_count", 1)
    return LocalSlice.of(str(machine.get("kind")), machine.get("accelerator_type"), machine.get("vms", 1), gpus)


def machine_words(machine: dict[str, Any]) -> str:
    """What a job's validated `machine` is, as an error message names it: v5litepod-16, g2-standard-8."""
    if machine.get("kind") == "tpu":
        return str(machine["accelerator_type"])
    return str(machine.get("machine_type", "the GPU VM"))


def check_chaos_workers(opts: Options, message: dict[str, Any]) -> None:
    """Worker chaos must name workers the job's machine has."""
    machine = message["machine"]
    for option, pairs in (
        ("--kill-worker-at-step", opts.kill_worker_at_steps),
        ("--hang-worker-at-step", opts.hang_worker_at_steps),
        ("--host-error-at-step", opts.host_error_at_steps),
    ):
        check_workers(option, pairs, job_slice(machine), machine_words(machine))


def check_zones(path: str, message: dict[str, Any], opts: Options) -> None:
    """What `respawn submit` checks, asked of the local APIs: each of the job's zones whether it offers the job's
    machine (the zones Google publishes for it, less `--unoffered`: localcloud/apis/offerings.py). A warning for
    each zone that does not (respawn skips it); UsageError, naming the local zones that do, when none does."""
    from localcloud.cloud import PROJECT, api_server
    from respawn.deployment import Settings
    from respawn_cli import main as submit

    with api_server(opts) as server:
        settings = Settings(project=PROJECT, tpu_endpoint=server.url, compute_endpoint=server.url)
        try:
            submit.check_zones(path, settings, message)
        except submit.UserError as e:
            raise UsageError(f"{e}{offered_here(message, opts)}") from e


def offered_here(message: dict[str, Any], opts: Options) -> str:
    """`; locally: ZONES offer MACHINE` for each of the job's machines that some local zone offers."""
    from localcloud.apis import offerings
    from localcloud.cloud import TRAINER_IMAGES
    from respawn.jobs import API_TPU, GpuMachine
    from respawn.spec import parse_job_message
    from respawn.topology import compute_shape
    from respawn_cli.offering import machine_words

    spec = parse_job_message(message, TRAINER_IMAGES)
    assert isinstance(spec, JobSpec)
    found = []
    for machine in dict.fromkeys(spec.machine_of(n) for n in range(len(spec.all_tiers))):
        if isinstance(machine, GpuMachine):
            types = [machine.machine_type, machine.accelerator_type]
        elif machine.api == API_TPU:
            types = [machine.accelerator_type]
        else:
            types = [compute_shape(machine.accelerator_type).machine_type]
        zones = offerings.zones_offering(types) or []
        zones = [z for z in zones if not set(types) & set(opts.unoffered.get(z, ()))]
        if zones:
            found.append(f"{', '.join(zones)} offer {machine_words(machine)}")
    return f"; locally: {'; '.join(found)}" if found else ""


def options(ns: argparse.Namespace) -> Options:
    """The local cloud's options, each wing's read from its own flags (the profile's figures later: `run`)."""
    from localcloud.cloud import Options

    return Options(
        **chaos.read_flags(ns),
        **pace_options(ns),
        workdir=Path(ns.workdir),
        entrypoint=parse_entrypoint(ns.entrypoint) if ns.entrypoint is not None else None,
        uploads=[parse_upload(text) for text in ns.upload],
        **slices.read_flags(ns),
    )


def add_reference_flags(run: argparse.ArgumentParser) -> None:
    """The uninterrupted reference run and where its results are kept (read by `reference_params`)."""
    run.add_argument("--no-reference", action="store_true", help="skip the uninterrupted reference run (exact: null)")
    run.add_argument(
        "--reference-cache",
        metavar="DIR",
        default=os.environ.get("RESPAWN_REFERENCE_CACHE"),
        help="keep the reference runs' results in DIR, which several workdirs may share "
        "(default $RESPAWN_REFERENCE_CACHE, else WORKDIR/reference)",
    )


@dataclass(frozen=True)
class Reference:
    """What the report compares the run with: the reference's params_sha256 (None: exactness unknown, `note` says
    why) and its final loss (a world's data-exactness is held to it)."""

    sha: str | None
    note: str
    final_loss: float | None = None


def job_slices(machine: dict[str, Any]) -> int:
    """How many slices the job's validated `machine` trains on as one world (1: no world)."""
    return max(1, int(machine.get("slices") or 1))


def processes_phrase(machine_slice: LocalSlice, world_slices: int) -> str:
    """How the reference runs: a slice's phrase, or for a world ` as a world of 2 slices on 8 processes (2 slices x
    2 hosts x 4 devices)`."""
    if world_slices <= 1:
        return machine_slice.processes_phrase()
    hosts, chips = machine_slice.hosts, machine_slice.chips_per_host
    return (
        f" as a world of {world_slices} slices on {world_slices * hosts} processes "
        f"({world_slices} slices x {hosts} hosts x {chips} devices)"
    )


def reference_params(
    ns: argparse.Namespace,
    opts: Options,
    message: dict[str, Any],
    machine_slice: LocalSlice,
    say: Callable[[str], None],
) -> Reference:
    """The uninterrupted reference run's params_sha256 and final loss (computed once, then cached), and the note
    saying why there is no hash (exactness then unknown). A job of several slices: the world of all of them."""
    from localcloud.reference import ReferenceFailed, reference_run

    reference_sha, note, loss = None, "no reference run (--no-reference)", None
    world_slices = job_slices(message["machine"])
    if not ns.no_reference:
        what = "command and args" if opts.entrypoint else "trainer args"
        say(
            f"reference: the uninterrupted run of the same {what}{processes_phrase(machine_slice, world_slices)} "
            "(computed once, then cached)"
        )
        try:
            with uploaded(opts.uploads) as (storage_env, data_key):
                ref = reference_run(
                    message.get("args") or [],
                    message.get("env") or {},
                    cache_dir=Path(ns.reference_cache or opts.workdir / "reference") / data_key,
                    base_env={**local_trainer_env(opts.workdir, compile_cache=opts.compile_cache), **storage_env},
                    log_path=opts.workdir / "reference.log",
                    machine_slice=machine_slice,
                    entrypoint=opts.entrypoint,
                    slices=world_slices,
                )
        except ReferenceFailed as e:
            note = str(e)
        else:
            reference_sha, loss = ref["params_sha256"], ref.get("final_loss")
            how = "cached" if ref["cached"] else f"computed in {ref['wall_s']:.1f}s"
            note = "the program sends no params_sha256 (the respawn_trainer library does)"
            result = f"params {reference_sha[:16]} after step {ref['final_step']}" if reference_sha else "completed"
            say(f"reference: {result} ({how})")
        if reference_sha is None:
            say(f"reference: exact unknown: {note}")
    return Reference(reference_sha, note, loss)


def add_output_flags(run: argparse.ArgumentParser) -> None:
    """How the report comes out (read by `write_report`)."""
    run.add_argument("--json", action="store_true", help="print the report as one JSON object (progress to stderr)")
    run.add_argument("--plot", metavar="FILE.png", help="write a timeline PNG")


def summarized(
    outcome: Outcome,
    message: dict[str, Any],
    reference: Reference,
    machine_slice: LocalSlice,
    run_timings: Timings,
) -> dict[str, Any]:
    """The report of the run (readout/report.py) and beside it how it ran: the bus, the timings, the run's folder,
    the status notices and where the secrets reached; `reference` is `reference_params`'s."""
    from localcloud.readout import report
    from respawn.prices import machine_price

    summary = report.build(
        events=outcome.events,
        job=outcome.job,
        reference_sha=reference.sha,
        machines_left=outcome.machines_left,
        leftover_processes=leftover_processes(),
        price=machine_price(message["machine"]),
        timed_out=outcome.timed_out,
        machine_slice=machine_slice,
        reference_note=reference.note,
        history=outcome.history,
        slices=job_slices(message["machine"]),
        reference_loss=reference.final_loss,
    )
    summary["bus"] = outcome.bus
    summary["timings"] = asdict(run_timings)  # local seconds; `scale` turns them into the real ones
    summary["run_dir"] = str(outcome.run_dir)
    summary["notifications"] = outcome.notifications
    if outcome.secrets is not None:
        summary["secrets"] = outcome.secrets
    return summary


def write_report(ns: argparse.Namespace, summary: dict[str, Any], outcome: Outcome, message: dict[str, Any]) -> None:
    """The plot (--plot), the files beside the run (report.html, metrics.json, report.json) and the report printed,
    as text or as one JSON object (--json)."""
    from localcloud.readout import report
    from localcloud.readout.monitoring import write_beside_report

    if ns.plot:
        from localcloud.readout.plot import plot_timeline

        plot_timeline(outcome.events, Path(ns.plot), f"{message['job_id']}: {summary['status']}")
        summary["plot"] = ns.plot
    summary.update(write_beside_report(outcome.run_dir, summary))  # report.html, metrics.json
    (outcome.run_dir / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    if ns.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(report.render(summary))


def leftover_processes() -> int:
    import psutil

    return len(psutil.Process().children(recursive=True))


def run(ns: argparse.Namespace) -> int:
    from localcloud.cloud import LocalCloud, signals_as_interrupt

    opts = options(ns)
    given_timings = timing_options(ns)
    message = load_message(ns.job, ns.trainer_arg, opts.entrypoint is not None)
    run_timings = given_timings.for_job(message)
    opts.creation_delay_s, opts.machine_timings = run_timings.creation_delay_s, run_timings.machine
    opts.time_scale = run_timings.scale  # the functions read the head start's drain in the profile's time
    opts.secrets = secret_values(message.get("secrets") or {}, ns.secret, ns.secrets_file)
    check_chaos_workers(opts, message)
    check_zones(ns.job, message, opts)  # before the reference run: a job no zone takes is refused at once
    machine_slice = job_slice(message["machine"])
    out = sys.stderr if ns.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    with signals_as_interrupt():
        reference = reference_params(ns, opts, message, machine_slice, say)
        cloud = LocalCloud(opts, say)
        outcome = cloud.run(message, total_steps(message.get("args") or []))
    summary = summarized(outcome, message, reference, machine_slice, run_timings)
    write_report(ns, summary, outcome, message)
    # exact, data-exact (a world that trained some steps on other members) or unknown; not "no"
    ok = summary["status"] == "SUCCEEDED" and summary["exactness"] != "no" and summary["machines_left"] == 0
    if outcome.secrets is not None:  # every trainer held them, and no file holds one
        ok = ok and not outcome.secrets["leaks"] and outcome.secrets["delivered"] == outcome.secrets["trainers"]
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parser().parse_args(argv)
    try:
        return run(ns)
    except (UsageError, ChaosError, SecretError) as e:
        print(f"respawn local: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"respawn local: interrupted ({e or 'SIGINT'}); everything was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
