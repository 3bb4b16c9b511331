"""Jobs on several slices (docs/design/several-slices.md), what the control plane holds of them: the job message's
`slices` and `min_slices` and what they are refused with, the versioned `World` and its metadata
value as the trainer reads it, the record of a job of one slice unchanged, and the `SetWorld` action as intent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_spec import gpu_machine, tpu_message, with_change

from respawn.actions import SetWorld, action_from_dict, action_to_dict
from respawn.jobs import Attempt, Job, Status, TpuMachine, World, machine_words
from respawn.spec import SpecError, parse_job_message, spec_to_message
from respawn_trainer.world import World as TrainerWorld


def refusal(message: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as e:
        parse_job_message(json.dumps(message).encode())
    return str(e.value)


def test_one_slice_is_todays_job_and_its_message_and_record_say_nothing_of_slices() -> None:
    spec = parse_job_message(json.dumps(with_change("machine.slices", 1)).encode())
    assert isinstance(spec.machine, TpuMachine) and (spec.machine.slices, spec.machine.min_slices) == (1, 1)
    assert "slices" not in spec_to_message(spec)["machine"]
    job = Job("llm", spec, Status.RUNNING, 1.0, 1.0, attempts=(Attempt(1, "us-central1-a", "llm-a1", 1.0),))
    record = job.to_dict()
    assert "world" not in record and "slice" not in record["attempts"][0]
    assert Job.from_dict(json.loads(json.dumps(record))) == job


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"machine.slices": 0}, "machine.slices", "an integer from 1 to 64"),
        ({"machine.slices": 65}, "machine.slices", "an integer from 1 to 64"),
        ({"machine.slices": 2, "machine.min_slices": 3}, "machine.min_slices", "3 is more than machine.slices (2)"),
        ({"machine.slices": 2, "head_start": False}, "head_start", "false with several slices"),
    ],
)
def test_slices_are_refused_with_the_field_and_what_is_allowed(change: dict[str, Any], field: str, words: str) -> None:
    message = tpu_message()
    for path, value in change.items():
        message = with_change(path, value, message)
    said = refusal(message)
    assert f'field "{field}"' in said and words in said and "allowed:" in said


def test_a_world_of_slices_is_read_and_shown_as_asked() -> None:
    message = with_change("machine.min_slices", 2, with_change("machine.slices", 4))
    spec = parse_job_message(json.dumps(message).encode())
    assert (spec.machine.slices, spec.machine.min_slices) == (4, 2)
    shown = spec_to_message(spec)["machine"]
    assert (shown["slices"], shown["min_slices"]) == (4, 2)


def test_a_gpu_world_is_of_single_vms() -> None:
    machine = {**gpu_machine(), "machine_type": "a2-highgpu-1g", "accelerator_type": "nvidia-tesla-a100", "vms": 2}
    said = refusal(with_change("machine", {**machine, "slices": 2}))
    assert 'field "machine.slices"' in said and "vms 1 with slices" in said


def test_a_world_changes_by_new_versions_and_a_repeated_change_is_no_change() -> None:
    first = World.first(3)
    assert first == World(1, (0, 1, 2))
    out = first.without(1, step=400)
    assert out == World(2, (0, 2), 400)
    assert out.without(1, step=500) is out  # the same notice again, or the preemption after the notice
    back = out.joined(1)
    assert back == World(3, (0, 1, 2), None)
    assert back.joined(1) is back
    assert World.from_dict(json.loads(json.dumps(back.to_dict()))) == back


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=30))
def test_versions_only_rise_and_members_are_what_the_changes_say(changes: list[tuple[bool, int]]) -> None:
    world, members = World.first(4), {0, 1, 2, 3}
    for leaves, slice_ in changes:
        before = world
        world = world.without(slice_) if leaves else world.joined(slice_)
        members = members - {slice_} if leaves else members | {slice_}
        assert world.members == tuple(sorted(members))
        assert world.version == before.version + (world.members != before.members)


def test_the_metadata_value_is_what_the_trainer_reads() -> None:
    told = TrainerWorld.parse(World(5, (0, 2), 1200).to_json())
    assert told is not None and (told.version, told.members, told.step) == (5, (0, 2), 1200)


def test_a_set_world_is_intent_that_round_trips() -> None:
    action = SetWorld("llm", 3, "llm-a3", "us-central1-a", World(2, (0,)).to_json())
    as_dict = action_to_dict(action)
    assert as_dict["kind"] == "set-world"
    assert action_from_dict(json.loads(json.dumps(as_dict))) == action


def test_a_status_table_says_how_many_slices() -> None:
    assert machine_words(TpuMachine("v6e-16", slices=4)) == "4xv6e-16"
    assert machine_words(TpuMachine("v6e-16")) == "v6e-16"
