"""The functions' limits in Terraform hold a fleet's preemption wave (docs/operations.md, "Sizing for a fleet").

The arithmetic the defaults come from: a preemption's handler holds its on_event instance while the replacement's
create operation runs, up to the machine adapters' create wait; the function's timeout must outlast two such waits
(a failed zone, then the next) and the sweep; Pub/Sub's ack deadline must outlast the timeout; and the wave of
SPEC 14 (200 machines within 60 s, bench/bench_fleet.py) must find an instance for every preemption in flight.
"""

from __future__ import annotations

import pytest
from tfconfig import Config, block

from respawn.adapters.settings import ProviderSettings

WAVE_MACHINES, WAVE_S = 200, 60.0  # bench/bench_fleet.py's defaults, SPEC section 14's wave


@pytest.fixture(scope="module")
def config() -> Config:
    return Config.load()


def default(config: Config, name: str) -> int:
    return int(config.variables[name]["default"])


def test_the_timeout_outlasts_two_create_waits(config: Config) -> None:
    wait = ProviderSettings().create_wait_s
    timeout = default(config, "function_timeout_seconds")
    assert timeout >= 2 * wait + 30, (timeout, wait)


def test_the_ack_deadline_outlasts_the_timeout(config: Config) -> None:
    push = config.resource("google_pubsub_subscription", "push")
    assert push["ack_deadline_seconds"] == "${min(600, var.function_timeout_seconds + 30)}"
    assert min(600, default(config, "function_timeout_seconds") + 30) > default(config, "function_timeout_seconds")
    retry = block(push, "retry_policy")
    assert (retry["minimum_backoff"], retry["maximum_backoff"]) == ("10s", "600s")


def test_a_wave_finds_an_instance_for_every_preemption_in_flight(config: Config) -> None:
    """Every preemption of the wave is in flight at once when a create wait outlasts the wave; one more for the
    sweep, and room for the lifecycle events of the jobs not hit."""
    wait = ProviderSettings().create_wait_s
    in_flight = min(WAVE_MACHINES, WAVE_MACHINES / WAVE_S * wait)
    assert default(config, "on_event_max_instances") >= in_flight + 1
    assert default(config, "on_job_message_max_instances") >= 10  # a burst of submissions, each a create wait
    fn = config.resource("google_cloudfunctions2_function", "respawn")
    assert block(fn, "service_config")["max_instance_request_concurrency"] == 1
