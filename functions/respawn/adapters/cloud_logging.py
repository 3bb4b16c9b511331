"""CloudLoggingReader: the LogReader port on Cloud Logging's entries.list, through google-cloud-logging."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

PAGE_SIZE = 1000  # entries per entries.list call (the API's maximum)


class CloudLoggingReader:
    """Entries of one project, oldest first. `client`: a google.cloud.logging.Client (default: one for `project`
    with Application Default Credentials)."""

    def __init__(self, project: str, client: Any = None) -> None:
        if client is None:
            from google.cloud import logging as cloud_logging

            client = cloud_logging.Client(project=project)  # type: ignore[no-untyped-call]
        self.project = project
        self.client = client

    def entries(self, filter_: str) -> Iterator[Mapping[str, Any]]:
        from google.cloud.logging import ASCENDING

        found = self.client.list_entries(
            resource_names=[f"projects/{self.project}"], filter_=filter_, order_by=ASCENDING, page_size=PAGE_SIZE
        )
        for entry in found:
            yield entry.to_api_repr()
