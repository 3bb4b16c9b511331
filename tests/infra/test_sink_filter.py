"""The sink filter's single source: Terraform and the code read the same file, and it agrees with the parser."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tfconfig import REPO, TF_DIR, Config

from respawn.events import Ignored
from respawn.parsing import TRAINER_EVENTS, log_entry_event
from respawn_ops import logfilter
from respawn_ops.logfilter import LogFilter, load_sink_filter, sink_filter

CAPTURED = sorted((REPO / "tests" / "data").glob("logentry_*.json"))


def load(path: Path) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return entry


def test_captured_entries_cover_both_verdicts() -> None:
    verdicts = {sink_filter().matches(load(path)) for path in CAPTURED}
    assert len(CAPTURED) >= 6 and verdicts == {True, False}


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: p.name)
def test_the_filter_routes_exactly_the_entries_the_parser_acts_on(path: Path) -> None:
    entry = load(path)
    event = log_entry_event(entry)
    assert sink_filter().matches(entry) is not isinstance(event, Ignored), event


def with_instance(name: str) -> dict[str, Any]:
    entry = copy.deepcopy(load(REPO / "tests" / "data" / "logentry_gce_preempted.json"))
    zone = entry["resource"]["labels"]["zone"]
    entry["protoPayload"]["resourceName"] = f"projects/p/zones/{zone}/instances/{name}"
    return entry


@pytest.mark.parametrize(
    "instance",
    [
        "llm-small-001-a1",
        "a-a7",
        "x" * 39 + "-a2",  # the longest job id
        "x" * 40 + "-a2",  # one too long
        "llm-a0",
        "llm-a01",
        "llm-a1-backup",
        "9llm-a1",
        "Llm-a1",
        "llm_x-a1",
        "t1v-n-2f3e9a1b-w-0",
        "t1v-n-2f3e9a1b-w-12",
        "t1v-n-XYZ-w-0",
        "t1v-n-2f3e9a1b-w-",
        "gke-pool-5b909138-nr65",
        # VMs of a slice MIG: baseInstanceName NAME-w plus a hyphen and 4 random [a-z0-9] (docs/compute-engine.md)
        "llm-small-001-a1-w-x7k2",
        "llm-a12-w-0a9z",
        "llm-a1-w-a123",  # a slice VM of llm-a1, not attempt 123 of a job `llm-a1-w`
        "llm-a1-w-ABCD",
        "llm-a1-w-x7k",
        "llm-a1-w-x7k2z",
        "llm-a1-w-",
        "llm-w-x7k2",
    ],
)
def test_the_filter_and_the_parser_agree_on_machine_names(instance: str) -> None:
    entry = with_instance(instance)
    assert sink_filter().matches(entry) is not isinstance(log_entry_event(entry), Ignored)


@pytest.mark.parametrize(
    ("instance", "routed"),
    [
        ("llm-small-001-a1", True),  # a GPU VM or single-host Compute Engine TPU VM
        ("llm-small-001-a1-w-x7k2", True),  # a VM of a Compute Engine slice's MIG
        ("llm-a12-w-0a9z", True),
        ("t1v-n-2f3e9a1b-w-3", True),  # a Cloud TPU API worker
        ("llm-a1-w-ABCD", False),  # a MIG's suffix is lowercase
        ("llm-a1-w-x7k2z", False),
        ("gke-pool-5b909138-nr65", False),
    ],
)
def test_the_sink_routes_every_kind_of_respawn_vm_and_nothing_else(instance: str, routed: bool) -> None:
    assert sink_filter().matches(with_instance(instance)) is routed


def with_node(name: str, log: str = "system_event") -> dict[str, Any]:
    entry = copy.deepcopy(load(REPO / "tests" / "data" / "logentry_tpu_node_terminated.json"))
    entry["protoPayload"]["resourceName"] = f"projects/p/locations/us-central2-b/nodes/{name}"
    entry["logName"] = f"projects/p/logs/cloudaudit.googleapis.com%2F{log}"
    return entry


@pytest.mark.parametrize(
    ("node", "log", "routed"),
    [
        ("llm-small-001-a1", "system_event", True),  # a Cloud TPU API node JOB-aN terminated by Google
        ("llm-small-001-a12", "activity", True),  # which audit log carries it is not documented: both are taken
        ("x" * 39 + "-a2", "system_event", True),
        ("x" * 40 + "-a2", "system_event", False),
        ("llm-a0", "system_event", False),
        ("llm-a1-w-x7k2", "system_event", False),  # a node is never a slice VM
        ("my-dev-node", "system_event", False),
        ("llm-a1", "data_access", False),
    ],
)
def test_the_sink_routes_terminated_nodes_of_respawn_and_nothing_else(node: str, log: str, routed: bool) -> None:
    entry = with_node(node, log)
    assert sink_filter().matches(entry) is routed
    assert isinstance(log_entry_event(entry), Ignored) is not routed


NUMBERS = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_the_deploy_guide_counts_and_names_the_lifecycle_events_the_filter_routes() -> None:
    guide = " ".join((REPO / "docs" / "deploy.md").read_text(encoding="utf-8").split())
    said = guide.split("`/logs/respawn-trainer` with the ", 1)[1].split(" lifecycle events", 1)[0]
    assert said == NUMBERS[len(TRAINER_EVENTS)]
    routed = load_sink_filter().split('jsonPayload.event=("', 1)[1].split(")", 1)[0]
    assert routed == '" OR "'.join(TRAINER_EVENTS) + '"'
    for event in TRAINER_EVENTS:
        assert f"`{event}`" in guide.split("lifecycle events:", 1)[1][:300]


# --- change the file, see both sides change ----------------------------------------------------------------------

HOST_ERROR = ' OR "compute.instances.hostError"'


def host_error_entry() -> dict[str, Any]:
    return load(REPO / "tests" / "data" / "logentry_host_error.json")


def copy_layout(root: Path, filter_text: str) -> tuple[Path, Path]:
    """A copy of infra/terraform and of the package's filter file, laid out as in the repository."""
    tf_dir = root / "infra" / "terraform"
    shutil.copytree(TF_DIR, tf_dir, ignore=shutil.ignore_patterns(".terraform", ".build"))
    filter_file = root / "respawn_ops" / "sink_filter.txt"
    filter_file.parent.mkdir(parents=True)
    filter_file.write_text(filter_text, encoding="utf-8")
    return tf_dir, filter_file


def terraform_sink_filter(tf_dir: Path) -> str:
    """The filter Terraform would give the sink: the content of its file() target."""
    config = Config.load(tf_dir)
    return config.file_target(config.resource("google_logging_project_sink", "events")["filter"]).read_text()


def test_changing_the_filter_file_changes_terraform_and_the_code_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = load_sink_filter()
    assert HOST_ERROR in original
    assert terraform_sink_filter(TF_DIR) == original
    assert sink_filter().matches(host_error_entry())

    modified = original.replace(HOST_ERROR, "")
    tf_dir, filter_file = copy_layout(tmp_path, modified)
    monkeypatch.setattr(logfilter, "SINK_FILTER", filter_file)  # the package resource, moved to the copy

    assert terraform_sink_filter(tf_dir) == modified != original  # what Terraform hands the sink changed ...
    assert load_sink_filter() == modified  # ... and so did what the local log router and the tests evaluate:
    assert not sink_filter().matches(host_error_entry())
    assert not LogFilter.parse(terraform_sink_filter(tf_dir)).matches(host_error_entry())


def test_the_filter_shown_in_the_deploy_guide_is_the_file() -> None:
    guide = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    shown = guide.split("<!-- sink_filter.txt -->\n```text\n", 1)[1].split("```", 1)[0]
    assert shown == load_sink_filter()
