"""GcsJobStore: job records as JSON objects in GCS, written only with compare-and-set.

Every write carries `if_generation_match` (0 = create only), so two handlers
that loaded the same generation cannot both win: the loser gets ConflictError,
reloads and re-decides. Only transient errors are retried, through the
library's conditional retry (safe because every write is conditional).
"""

from __future__ import annotations

import json

from google.api_core import exceptions
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY, DEFAULT_RETRY_IF_GENERATION_SPECIFIED

from respawn.model import Job
from respawn.ports import ConflictError, TransientError

_TRANSIENT = (
    exceptions.TooManyRequests,
    exceptions.InternalServerError,
    exceptions.BadGateway,
    exceptions.ServiceUnavailable,
    exceptions.GatewayTimeout,
    exceptions.RetryError,
)


def function_client(project: str | None = None) -> storage.Client:
    """The storage client of the deployed functions: it does not read proxy settings from the environment.

    requests looks the proxy variables up on every call (a walk over os.environ,
    about a quarter of a handler's CPU time); the functions reach GCS directly.
    The CLI keeps the default client, which honours HTTPS_PROXY.
    """
    client = storage.Client(project=project)
    client._http.trust_env = False
    return client


class GcsJobStore:
    """JobStore on `gs://BUCKET/PREFIX/JOB_ID.json` (default prefix `respawn/jobs/`)."""

    def __init__(self, bucket: str, client: storage.Client | None = None, prefix: str = "respawn/jobs/") -> None:
        self._client = client or storage.Client()
        self._bucket = self._client.bucket(bucket)
        self._prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.bucket_name = bucket

    def _path(self, job_id: str) -> str:
        return f"{self._prefix}{job_id}.json"

    def load(self, job_id: str) -> tuple[Job | None, int]:
        blob = self._bucket.blob(self._path(job_id))
        try:
            data = blob.download_as_bytes(retry=DEFAULT_RETRY)
        except exceptions.NotFound:
            return None, 0
        except _TRANSIENT as e:
            raise TransientError(f"reading gs://{self.bucket_name}/{blob.name}: {e}") from e
        # The download reports the generation of exactly the bytes it returned (x-goog-generation).
        return Job.from_dict(json.loads(data)), int(blob.generation or 0)

    def save(self, job: Job, generation: int) -> int:
        blob = self._bucket.blob(self._path(job.job_id))
        body = json.dumps(job.to_dict(), indent=1, sort_keys=True)
        try:
            blob.upload_from_string(
                body,
                content_type="application/json",
                if_generation_match=generation,
                retry=DEFAULT_RETRY_IF_GENERATION_SPECIFIED,
            )
        except exceptions.PreconditionFailed as e:
            raise ConflictError(f"{job.job_id}: the record is no longer at generation {generation}") from e
        except _TRANSIENT as e:
            raise TransientError(f"writing gs://{self.bucket_name}/{blob.name}: {e}") from e
        return int(blob.generation)

    def list_ids(self) -> list[str]:
        try:
            blobs = self._client.list_blobs(self._bucket, prefix=self._prefix, retry=DEFAULT_RETRY)
            names = [b.name for b in blobs]
        except _TRANSIENT as e:
            raise TransientError(f"listing gs://{self.bucket_name}/{self._prefix}: {e}") from e
        return sorted(n[len(self._prefix) : -len(".json")] for n in names if n.endswith(".json"))
