"""What a local machine gets from outside itself, so that it runs the real startup script (adapters/startup.py).

A VM of the cloud has a metadata server, a container runtime and gcloud; a local machine has local stand-ins for
exactly those, and nothing else differs:

* `MetadataServer`: the VM's metadata server over HTTP on loopback, which the script reaches the way it reaches the
  real one (`GCE_METADATA_HOST`, as Google's client libraries read it): the machine's metadata attributes, this
  worker's `agent-worker-number` and the slice's `worker-network-endpoints`, `preempted`, a token, the project;
  each with its ETag, and the hanging GET (`wait_for_change`) by which the script learns a change of its metadata
  (metadata_wait.py), live: a write to the machine's metadata in the API reaches it (nodes.py's `on_metadata`).
* `SecretManager`: Secret Manager's `versions/V:access` over HTTP, answering from the local secret store, and
  `CloudLogging`: Cloud Logging's `entries:write`, where the machine's scripts write their entries: the scripts reach
  both with curl and the machine's token, at the endpoints gcloud's overrides name
  (`CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER`, `..._LOGGING`).
* `docker` (`python -m localcloud.machines.machine_host docker ...`): runs the image's command (`python -m trainer`, or
  the local cloud's entrypoint), or `--entrypoint`'s, as a local process in its own process group with only the
  image's environment and what `-e`/`--env-file` pass, honouring `run` (`--name`, `--rm`, signals proxied to the
  container as docker's default `--sig-proxy` does), `stop -t N` (SIGTERM, SIGKILL after N s), `rm -f`, `pull`,
  `image inspect`, `login` and `info`. The container's log driver is the machine's log: its output is the script's
  output, and the lifecycle entries a trainer sends to Cloud Logging (`RESPAWN_LOG_SINK=cloud`) come on its stdout,
  which the machine reads (local/nodes.py). Its images are names in the VM's image store (on its disk): `pull` of
  one it lacks takes the machine's pull time, of one it has its refresh time, and `run` starts the trainer after
  the machine's trainer start time (localcloud/machines/profiles.py).
* `gcloud`: a snap's, as Ubuntu's TPU and GPU images have it: during the VM's shutdown it fails as snapd makes it
  fail (`TransactionIsDestructive`); it knows no command, since the scripts need none of it.
* `apt-get` and `systemctl`, for a boot image without Docker: `apt-get install docker.io` takes the machine's
  install time and puts `docker` on the VM's PATH; anything else does nothing.

Its `docker run` runs the container's process as the image's USER, whatever the command (`--entrypoint` replaces the
image's command, not its user): respawn's trainer image runs as its own (`RESPAWN_LOCAL_IMAGE_USER`: uid 10001),
any other image as root (`image_user`), so only what the container is given is writable to it; and `stop_all` is
what the daemon does as the VM shuts down: each container stopped with its own stop timeout (`run --stop-timeout`,
docker's 10 s default).

The shims learn where things are from the machine's environment (`RESPAWN_LOCAL_*`), never from the script. Each
timed step (`install`, `pull`) prints one line `STEP_MARK {"step", "start", "end"}` on stderr, from which the
machine's log reader times the recovery (local/nodes.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from localcloud.machines.metadata_wait import Reply, WatchedValues, attribute_reader

DOCKER_DIR = "RESPAWN_LOCAL_DOCKER_DIR"  # where the docker shim keeps its containers (NAME.pid)
IMAGE_ENV = "RESPAWN_LOCAL_IMAGE_ENV"  # JSON object: the image's environment (what a container starts from)
IMAGE_CMD = "RESPAWN_LOCAL_IMAGE_CMD"  # JSON list: the image's command, before the container's args
IMAGE_LABELS = "RESPAWN_LOCAL_IMAGE_LABELS"  # JSON object: the image's labels
IMAGE_USER = "RESPAWN_LOCAL_IMAGE_USER"  # respawn's trainer image's USER as UID:GID (empty: root); see image_user
IMAGE_WORKDIR = "RESPAWN_LOCAL_IMAGE_WORKDIR"  # the image's WORKDIR (empty: a directory of the container's own)
DEFAULT_STOP_TIMEOUT_S = 10  # the daemon's stop timeout of a container run without --stop-timeout (docker's)
LABELS_FORMAT = "{{json .Config.Labels}}"  # the one `image inspect --format` the startup script asks
PULL_S = "RESPAWN_LOCAL_PULL_S"  # seconds a `docker pull` of an image the VM lacks takes
REFRESH_S = "RESPAWN_LOCAL_REFRESH_S"  # seconds a `docker pull` of an image the VM has takes (its manifest)
START_S = "RESPAWN_LOCAL_START_S"  # seconds between `docker run` and the trainer's process
INSTALL_S = "RESPAWN_LOCAL_INSTALL_S"  # seconds `apt-get install docker.io` takes
VM_BIN = "RESPAWN_LOCAL_VM_BIN"  # the VM's own bin directory, where apt-get installs docker
STEP_MARK = "respawn-local-machine-step"  # a timed step's line on stderr: STEP_MARK {"step", "start", "end"}
STOP_POLL_S = 0.05
# What the startup script runs on a boot image without Docker, besides the shims: a PATH of links to only these,
# so that no program of this machine (its own docker above all) stands in for one the VM lacks.
VM_TOOLS: tuple[str, ...] = ("bash", "sh", "curl", "sed", "tr", "grep", "awk", "paste", "cut", "rm", "touch")
VM_TOOLS += ("sleep", "seq", "cat", "base64", "mkdir", "chmod", "head", "gpg", "env", "date")


Answer = tuple[int, bytes]  # (HTTP status, body)


class _Server:
    """A ThreadingHTTPServer on loopback, served on a daemon thread: `get(path, headers)` and `post(path, headers,
    body)` answer (status, body) or (status, body, headers); a server without `post` answers POST with 405. A client
    gone mid-request (its machine deleted: the connection reset or closed before the answer) is nobody's error: no
    traceback, as a real server's log would not print one either."""

    def __init__(
        self,
        get: Callable[[str, Mapping[str, str]], Answer | Reply],
        post: Callable[[str, Mapping[str, str], bytes], Answer] | None = None,
    ) -> None:
        from http.server import BaseHTTPRequestHandler  # the servers' only: not the shims'

        from localcloud.machines.quiet_server import QuietServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(get(self.path, {k: v for k, v in self.headers.items()}))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()}
                self._answer(post(self.path, headers, body) if post is not None else (405, b""))

            def _answer(self, answer: Answer | Reply) -> None:
                status, body, *extra = answer
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = QuietServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class MetadataServer(_Server):
    """One VM's metadata server (https://cloud.google.com/compute/docs/metadata/querying-metadata): answers only
    requests with `Metadata-Flavor: Google` (403 otherwise), 404 for a key it does not have; every value with its
    ETag, and `?wait_for_change=true` (with `last_etag`, `timeout_sec`) as a hanging GET (metadata_wait.py).

    Its attributes are live: `set_attributes` (a `nodes.patch` or `instances.setMetadata` of the VM's machine, or
    `preempted` set) changes what it serves and wakes the requests waiting for a change."""

    def __init__(self, project: str, attributes: Mapping[str, str], instance: str = "", zone: str = "") -> None:
        self.project = project
        self.watch = WatchedValues()
        self._attributes = dict(attributes)
        self.instance, self.zone = instance, zone  # `instance/name`, and `instance/zone` (projects/P/zones/Z)
        self._preempted = False  # `instance/preempted`: TRUE from the notice on
        super().__init__(self._get)

    @property
    def attributes(self) -> dict[str, str]:
        return dict(self._attributes)

    def set_attributes(self, attributes: Mapping[str, str]) -> None:
        """Serve these attributes from now on (the machine's metadata was written), waking the waiters."""
        self.watch.update(lambda: setattr(self, "_attributes", dict(attributes)))

    @property
    def preempted(self) -> bool:
        return self._preempted

    @preempted.setter
    def preempted(self, value: bool) -> None:
        self.watch.update(lambda: setattr(self, "_preempted", value))

    def close(self) -> None:
        self.watch.close()
        super().close()

    def _get(self, path: str, headers: Mapping[str, str]) -> Answer | Reply:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, b"Missing Metadata-Flavor:Google header."
        where, _, query = path.partition("?")
        key = where.removeprefix("/computeMetadata/v1/")
        if key.startswith("instance/attributes/"):
            return self.watch.answer(attribute_reader(lambda: self._attributes, key.split("/", 2)[2]), query)
        answers: dict[str, Callable[[], str]] = {
            "instance/preempted": lambda: "TRUE" if self._preempted else "FALSE",
            "instance/service-accounts/default/token": lambda: json.dumps(
                {"access_token": "local", "expires_in": 3600, "token_type": "Bearer"}
            ),
            "project/project-id": lambda: self.project,
            "instance/name": lambda: self.instance,
            "instance/zone": lambda: f"projects/{self.project}/zones/{self.zone}",
        }
        if key not in answers:
            return 404, b"not found"
        return self.watch.answer(lambda: answers[key]().encode(), query)


class CloudLogging(_Server):
    """Cloud Logging's `POST /v2/entries:write` for one VM (https://cloud.google.com/logging/docs/reference/v2/rest/v2/
    entries/write), where the machine's scripts write their entries: each entry's log id (the end of `logName`) and
    `jsonPayload` to `on_entry`; 401 without a bearer token, 400 for a body that is no such request."""

    def __init__(self, on_entry: Callable[[str, dict[str, Any]], None]) -> None:
        self.on_entry = on_entry
        super().__init__(lambda path, headers: (404, b"not found"), self._post)

    @property
    def endpoint(self) -> str:
        """The API's root as gcloud's endpoint overrides name it (CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING)."""
        return f"http://{self.host}/"

    def _post(self, path: str, headers: Mapping[str, str], body: bytes) -> Answer:
        if path != "/v2/entries:write":
            return 404, b"not found"
        if not headers.get("Authorization", "").startswith("Bearer "):
            return 401, json.dumps({"error": {"code": 401, "status": "UNAUTHENTICATED"}}).encode()
        try:
            entries = [
                (str(e["logName"]).rsplit("/", 1)[-1], dict(e["jsonPayload"])) for e in json.loads(body)["entries"]
            ]
        except (ValueError, KeyError, TypeError):
            return 400, json.dumps({"error": {"code": 400, "status": "INVALID_ARGUMENT"}}).encode()
        for log, payload in entries:
            self.on_entry(log, payload)
        return 200, b"{}"


class SecretManager(_Server):
    """Secret Manager's `GET /v1/projects/P/secrets/S/versions/V:access` from {reference: value}: the documented
    answer (`payload.data` base64), or 404 NOT_FOUND for a reference without a value."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        super().__init__(self._get)

    @property
    def endpoint(self) -> str:
        """The API's root as gcloud's endpoint overrides name it (CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER)."""
        return f"http://{self.host}/"

    def _get(self, path: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        if not headers.get("Authorization", "").startswith("Bearer "):
            return 401, json.dumps({"error": {"code": 401, "status": "UNAUTHENTICATED"}}).encode()
        ref = path.removeprefix("/v1/").removesuffix(":access")
        if ref not in self.values:
            return 404, json.dumps({"error": {"code": 404, "status": "NOT_FOUND"}}).encode()
        data = base64.b64encode(self.values[ref].encode()).decode()
        return 200, json.dumps({"name": ref, "payload": {"data": data}}).encode()


# ---- docker -----------------------------------------------------------------------------------------------------

_WITH_VALUE = {"--name", "-e", "--env", "--env-file", "--log-driver", "--log-opt", "--gpus", "--entrypoint", "--net"}
_WITH_VALUE |= {"--network", "-v", "--volume", "-w", "--workdir", "-u", "--user", "--stop-timeout", "--ulimit"}


def _options(
    args: Sequence[str], with_value: frozenset[str] | set[str] = _WITH_VALUE
) -> tuple[list[tuple[str, str]], list[str]]:
    """(option, value) pairs up to the first argument that is no option (`with_value`: the options that take a
    value), and the rest (IMAGE ARGS..., or the containers' names)."""
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        flag, eq, value = args[i].partition("=")
        if flag in with_value and not eq:
            i += 1
            value = args[i] if i < len(args) else ""
        opts.append((flag, value))
        i += 1
    return opts, list(args[i:])


def container_env(opts: Sequence[tuple[str, str]], environ: Mapping[str, str]) -> dict[str, str]:
    """The image's environment, then `-e K=V`, `-e K` (this environment's K, when set) and `--env-file` lines."""
    env = dict(json.loads(environ.get(IMAGE_ENV) or "{}"))
    for flag, value in opts:
        if flag in ("-e", "--env"):
            key, eq, given = value.partition("=")
            if eq:
                env[key] = given
            elif key in environ:
                env[key] = environ[key]
        elif flag == "--env-file":
            for line in Path(value).read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    key, _, given = line.partition("=")
                    env[key.strip()] = given
    if env.get("RESPAWN_LOG_SINK") == "cloud":  # the machine reads Cloud Logging's lifecycle entries on stdout
        env["RESPAWN_LOG_SINK"] = "stdout"
    if environ.get("GCE_METADATA_HOST"):  # the VM's metadata server, which a real container reaches (--net=host)
        env.setdefault("RESPAWN_METADATA_URL", f"http://{environ['GCE_METADATA_HOST']}/computeMetadata/v1")
    return env


def _pid(state: Path, name: str) -> int | None:
    try:
        pid = int((state / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def container_pid(state: Path, name: str) -> int | None:
    """The process of container `name` under `state` (a machine's docker directory), None when none runs."""
    return _pid(state, name)


def _run(args: Sequence[str], environ: Mapping[str, str], state: Path) -> int:
    opts, rest = _options(args)
    if not rest:
        print('docker: "docker run" requires at least 1 argument.', file=sys.stderr)
        return 125
    given = dict(opts)
    name = given.get("--name") or f"container-{os.getpid()}"
    if _pid(state, name) is not None:
        print(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use.')
        return 125
    entrypoint = given.get("--entrypoint")
    command = [entrypoint] if entrypoint else list(json.loads(environ.get(IMAGE_CMD) or "[]"))
    argv = [*command, *rest[1:]]
    start_s = _seconds(environ, START_S)
    if start_s:  # the container exists from here on (stop and rm find it); its trainer starts after the delay
        argv = ["/bin/sh", "-c", 'sleep "$0" && exec "$@"', f"{start_s:g}", *argv]
    state.mkdir(parents=True, exist_ok=True)
    env = container_env(opts, environ)
    user = given.get("-u") or given.get("--user") or image_user(rest[0], environ)
    argv, cwd = _as_user(user, argv, env, state / f"{name}.fs", environ.get(IMAGE_WORKDIR) or None)
    try:
        child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, process_group=0, close_fds=True)
    except OSError as e:
        print(f"docker: Error response from daemon: failed to create task for container: exec: {e}", file=sys.stderr)
        return 127
    pidfile = state / f"{name}.pid"
    stop_timeout = given.get("--stop-timeout") or str(DEFAULT_STOP_TIMEOUT_S)
    (state / f"{name}.stop-timeout").write_text(stop_timeout)  # the daemon's, when it stops (stop_all)
    pidfile.write_text(str(child.pid))
    proxied = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in proxied:  # docker run's --sig-proxy (on by default)
        signal.signal(sig, lambda s, _f: _kill(child.pid, s))
    code = child.wait()
    for sig in proxied:  # the container is gone: a signal now (its machine deleted) must not change its exit code
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        pidfile.unlink()
    return 128 - code if code < 0 else code


def image_user(image: str, environ: Mapping[str, str]) -> str:
    """The user `docker run IMAGE` runs the container's process as without `-u`: the image's USER, whatever command
    runs. respawn's trainer image (REPOSITORY/trainer or REPOSITORY/trainer-cuda, any tag or digest:
    respawn.machine.TRAINER_IMAGES) names its own (IMAGE_USER, trainer/Dockerfile's); the local machine knows no
    other image's USER and runs it as root, as an image that names none does (examples/byo/Dockerfile)."""
    from respawn.machine import TRAINER_IMAGES

    name = re.split(r"[:@]", image.rpartition("/")[2])[0]
    return environ.get(IMAGE_USER, "") if name in TRAINER_IMAGES.values() else ""


def _as_user(
    user: str, argv: list[str], env: dict[str, str], fs: Path, image_workdir: str | None
) -> tuple[list[str], Path]:
    """The container's process as the image's USER (`UID[:GID]`; empty, 0 or root: root), as docker runs it, and its
    working directory: `fs` stands for the image's own files, its WORKDIR owned by root (unless the image names one:
    `image_workdir`) and the user's HOME by the user (docker sets HOME from the image's passwd). Only those and what
    the container is given (its mounts: the same paths here) are writable to it. It can read everything, as the files
    of an image are readable: the interpreter and packages it runs lie in this machine's directories, which a user of
    the image need not be able to enter (setpriv keeps CAP_DAC_READ_SEARCH for it; writes are checked as for any
    process of that user). Where this machine cannot switch users (not root, or no setpriv), the container runs as
    this machine's user, and the machine says so."""
    workdir, home = fs / "workdir", fs / "home"
    for directory in (workdir, home):
        directory.mkdir(parents=True, exist_ok=True)
    workdir = Path(image_workdir) if image_workdir else workdir
    env.setdefault("HOME", str(home))
    uid, _, gid = user.partition(":")
    if user in ("", "0", "root", "0:0"):
        return argv, workdir
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not uid.isdigit() or not (gid or uid).isdigit():
        print(
            f"docker: the local machine runs the container as its own user, not the image's ({user})", file=sys.stderr
        )
        return argv, workdir
    os.chown(home, int(uid), int(gid or uid))
    print(f"docker: the container runs as user {uid}:{gid or uid}", file=sys.stderr)  # in the machine's log
    ids = [f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups"]
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return [setpriv, *ids, *caps, *argv], workdir


def stop_all(state: Path) -> None:
    """What the docker daemon does as the machine shuts down (systemd stops docker.service alongside the shutdown
    script): each running container stopped with its own stop timeout (`run --stop-timeout`, docker's default
    10 s), in parallel."""
    names = [pidfile.stem for pidfile in state.glob("*.pid")] if state.is_dir() else []

    def stop(name: str) -> None:
        try:
            timeout = float((state / f"{name}.stop-timeout").read_text())
        except (OSError, ValueError):
            timeout = DEFAULT_STOP_TIMEOUT_S
        pid = _pid(state, name)
        if pid is not None:
            _stop_container(state, name, pid, timeout)

    threads = [threading.Thread(target=stop, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _each(names: Sequence[str], state: Path, act: Callable[[str, int], bool]) -> int:
    """`act(name, pid)` on each running container named (False: it refused, its message printed); docker's exit
    code: 1 when a container is missing or refused."""
    code = 0
    for name in names:
        pid = _pid(state, name)
        if pid is None:
            print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
            code = 1
        elif act(name, pid):
            print(name)
        else:
            code = 1
    return code


def _stop(args: Sequence[str], state: Path) -> int:
    """SIGTERM to each container, SIGKILL when it has not ended `-t` seconds later (docker's default: 10)."""
    opts, names = _options(args, {"-t", "--time"})
    timeout = float(dict(opts).get("-t") or dict(opts).get("--time") or 10)

    return _each(names, state, lambda name, pid: _stop_container(state, name, pid, timeout))


def _stop_container(state: Path, name: str, pid: int, timeout: float) -> bool:
    """SIGTERM to the container, SIGKILL when it has not ended `timeout` seconds later."""
    _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid(state, name) is not None and time.monotonic() < deadline:
        time.sleep(STOP_POLL_S)
    _kill(pid, signal.SIGKILL)
    return True


def _rm(args: Sequence[str], state: Path) -> int:
    """`rm -f`: SIGKILL to each container; without -f a running container is refused."""
    opts, names = _options(args)
    force = any(flag in ("-f", "--force") for flag, _ in opts)

    def remove(name: str, pid: int) -> bool:
        if not force:
            print(f"Error response from daemon: cannot remove container {name}: container is running", file=sys.stderr)
            return False
        _kill(pid, signal.SIGKILL)
        return True

    return _each(names, state, remove)


def _seconds(environ: Mapping[str, str], name: str) -> float:
    return float(environ.get(name) or 0)


def mark(step: str, start: float, end: float) -> None:
    """The timed step's line on stderr, for the machine's log reader."""
    print(f"{STEP_MARK} {json.dumps({'step': step, 'start': start, 'end': end})}", file=sys.stderr, flush=True)


def _image_file(state: Path, image: str) -> Path:
    """Where the VM's image store keeps `image` (its name, made a file name)."""
    return state / "images" / base64.urlsafe_b64encode(image.encode()).decode()


def has_image(state: Path, image: str) -> bool:
    return _image_file(state, image).exists()


def add_image(state: Path, image: str) -> None:
    """Put `image` in the VM's image store (a pull, or a boot image that holds it)."""
    path = _image_file(state, image)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(image)


def _pull(args: Sequence[str], environ: Mapping[str, str], state: Path) -> int:
    """The whole image when the VM lacks it, else only its manifest: each takes the machine's time."""
    _, rest = _options(args)
    if not rest:
        print('"docker pull" requires exactly 1 argument.', file=sys.stderr)
        return 1
    image = rest[0]
    had = has_image(state, image)
    start = time.time()
    time.sleep(_seconds(environ, REFRESH_S if had else PULL_S))
    add_image(state, image)
    mark("pull", start, time.time())
    print(f"Status: {'Image is up to date' if had else 'Downloaded newer image'} for {image}")
    return 0


def _image(args: Sequence[str], environ: Mapping[str, str], state: Path) -> int:
    """`image inspect [--format '{{json .Config.Labels}}'] NAME`: 0 when the VM has the image (its labels with that
    format), 1 (docker's message) when not."""
    opts, rest = _options(args[1:], {"--format", "-f"})
    formats = {value for flag, value in opts if flag in ("--format", "-f")}
    if args[:1] != ["inspect"] or not rest or not formats <= {LABELS_FORMAT}:
        print(f"docker: 'image {' '.join(args)}' is not a command the local machine has.", file=sys.stderr)
        return 1
    missing = [image for image in rest if not has_image(state, image)]
    for image in missing:
        print(f"Error response from daemon: No such image: {image}", file=sys.stderr)
    if missing:
        return 1
    labels = json.loads(environ.get(IMAGE_LABELS) or "null")
    for image in rest:
        if formats:
            print(json.dumps(labels, separators=(",", ":")))
        else:
            print(json.dumps([{"RepoTags": [image], "Config": {"Labels": labels}}]))
    return 0


def docker(args: Sequence[str], environ: Mapping[str, str]) -> int:
    state = Path(environ[DOCKER_DIR])
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "run":
        return _run(rest, environ, state)
    if command == "stop":
        return _stop(rest, state)
    if command == "rm":
        return _rm(rest, state)
    if command == "pull":
        return _pull(rest, environ, state)
    if command == "image":
        return _image(rest, environ, state)
    if command == "login":
        sys.stdin.read()
        print("Login Succeeded")
        return 0
    if command == "info":
        print("Server: the local machine's container runtime (respawn local cloud)")
        return 0
    print(f"docker: '{command}' is not a docker command the local machine has.", file=sys.stderr)
    return 1


# ---- gcloud ----------------------------------------------------------------------------------------------------

# What a snap's gcloud says at shutdown (Ubuntu's TPU and GPU images install Google's CLI as a snap; snapd refuses to
# run it while the system shuts down): public reports against gsutil and Google's runner modules
SNAP_REFUSAL = (
    "error: cannot perform operation: mount --rbind /dev /tmp/snap.rootfs_x/dev: "
    "TransactionIsDestructive: a system shutdown is in progress"
)
SHUTTING_DOWN = "shutting-down"  # a file in the VM's home once its shutdown began (Nodes writes it)


def gcloud(args: Sequence[str], environ: Mapping[str, str]) -> int:
    """The boot image's gcloud, a snap: it fails during shutdown as a snap does; the machine's scripts do not need
    it (they reach Google's APIs with curl and the machine's token), so it knows no command besides."""
    if (Path(environ.get("HOME", "/nonexistent")) / SHUTTING_DOWN).exists():
        print(SNAP_REFUSAL, file=sys.stderr)
        return 1
    print(f"ERROR: (gcloud) the local machine's gcloud has no {' '.join(args[:3])!r}", file=sys.stderr)
    return 2


# ---- apt-get ----------------------------------------------------------------------------------------------------


def apt_get(args: Sequence[str], environ: Mapping[str, str]) -> int:
    """`install ... docker.io` takes the machine's install time, then `docker` is on the VM's PATH."""
    if "install" in args and "docker.io" in args:
        start = time.time()
        time.sleep(_seconds(environ, INSTALL_S))
        vm_bin = Path(environ[VM_BIN])
        vm_bin.mkdir(parents=True, exist_ok=True)
        installed = vm_bin / "docker"
        if not installed.exists():
            installed.symlink_to(docker_package(Path(environ[BIN_DIR])) / "docker")
        mark("install", start, time.time())
    return 0


def main(argv: Sequence[str]) -> int:
    tool, args = argv[0], argv[1:]
    if tool == "docker":
        return docker(args, os.environ)
    if tool == "gcloud":
        return gcloud(args, os.environ)
    if tool == "apt-get":
        return apt_get(args, os.environ)
    print(f"{tool}: not a tool of the local machine; allowed: docker, gcloud, apt-get", file=sys.stderr)
    return 2


BIN_DIR = "RESPAWN_LOCAL_BIN_DIR"  # where install() put the shims


def docker_package(bin_dir: Path) -> Path:
    """The directory holding the `docker` shim, on the PATH of a VM whose boot image has Docker."""
    return bin_dir / "docker.io"


def install(bin_dir: Path) -> Path:
    """The shims in `bin_dir` (put first on the machine's PATH), run by this interpreter: `gcloud`, `apt-get`,
    `systemctl` (which has nothing to do), the GPU image's `nvidia-smi` / `nvidia-ctk` (its driver and container
    toolkit are installed: nothing to wait for); `docker` in `docker_package(bin_dir)`, and `tools/`: links to
    VM_TOOLS, the PATH of a VM without Docker."""
    import shlex

    import localcloud
    import respawn

    package = docker_package(bin_dir)
    tools = bin_dir / "tools"
    for directory in (bin_dir, package, tools):
        directory.mkdir(parents=True, exist_ok=True)
    # the directories holding the respawn and localcloud packages (functions/ and the repository root)
    roots = dict.fromkeys(str(Path(str(pkg.__file__)).resolve().parents[1]) for pkg in (respawn, localcloud))
    # -S: no site-packages (the shims need the standard library, respawn and localcloud only), so each call starts in
    # a third of the time: a VM's docker and gcloud answer at once, and the recovery split times the script, not the
    # shims.
    path = shlex.quote(":".join(roots))
    run = f"PYTHONPATH={path} exec {shlex.quote(sys.executable)} -S -m localcloud.machines.machine_host"
    for where, tool in ((package, "docker"), (bin_dir, "gcloud"), (bin_dir, "apt-get")):
        (where / tool).write_text(f'#!/bin/sh\n{run} {tool} "$@"\n')
        (where / tool).chmod(0o755)
    for tool in ("nvidia-smi", "nvidia-ctk", "systemctl"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / tool).chmod(0o755)
    for tool in VM_TOOLS:
        found = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin")
        if found and not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    return bin_dir


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
