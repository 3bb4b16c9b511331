"""One Cloud Function as a pool of instances that each take one request at a time (the fleet mode of functions.py).

Terraform deploys each function with `max_instance_count` instances and `max_instance_request_concurrency = 1`
(infra/terraform/functions.tf): at most that many events are handled at once, one per instance, and the next waits.
Here the function's app (functions-framework's, from functions/main.py, unchanged) is served by gunicorn's sync
workers, `--instances` of them: a sync worker accepts a connection only when it is idle and answers one request at a
time, and connections beyond the busy workers wait in the listening socket's backlog. A request longer than
`--timeout` has its worker killed and restarted (the push gets no answer and is redelivered), as a function's
timeout ends a request. What this does not simulate: cold starts (the workers fork from a process that has imported
the function and its client libraries: warm instances), scaling to zero, and Cloud Run's own queue limits.

    python -m localcloud.services.function_pool --target on_event --source functions/main.py --port 8080 --instances 10
"""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Any

import gunicorn.app.base

# What a function instance imports on its first events: imported once here, before the workers fork, so that every
# worker starts warm
WARM = ("google.cloud.storage", "google.cloud.tpu_v2", "google.cloud.compute_v1", "google.cloud.pubsub_v1")


class Pool(gunicorn.app.base.BaseApplication):  # type: ignore[misc]
    def __init__(self, app: Any, options: dict[str, Any]) -> None:
        self.app = app
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self.app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--instances", type=int, required=True, help="workers, each one request at a time")
    ap.add_argument("--timeout", type=int, default=0, help="seconds a request may take (0: no limit)")
    a = ap.parse_args()
    import functions_framework

    app = functions_framework.create_app(a.target, a.source, "cloudevent")  # type: ignore[no-untyped-call]
    for module in WARM:
        try:
            importlib.import_module(module)
        except ImportError:  # a client this deployment does not install is imported by no event either
            continue
    options = {
        "bind": f"127.0.0.1:{a.port}",
        "workers": a.instances,
        "worker_class": "sync",
        "timeout": a.timeout,
        "backlog": 2048,
        "loglevel": os.environ.get("GUNICORN_LOG_LEVEL", "error"),
    }
    Pool(app, options).run()


if __name__ == "__main__":
    main()
