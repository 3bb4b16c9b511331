"""The local run's report of a job of several slices: the worlds it trained in and how exact its result is."""

from __future__ import annotations

from typing import Any

from localcloud.readout.report import build, lost_steps, render
from localcloud.readout.worlds import steps_once, world_rows

REF_SHA, OTHER_SHA = "a" * 64, "b" * 64
REF_LOSS = 3.3173


def entry(t: float, attempt: int, **payload: Any) -> dict[str, Any]:
    return {"t": t, "kind": "entry", "machine": f"world-a{attempt}", "attempt": attempt, "payload": payload}


def world(t: float, version: int, members: dict[int, int], start: int, saves: list[int]) -> list[dict[str, Any]]:
    """World `version` of member slices {slice: attempt}: each member's lead sends `started`, then its saves."""
    events = [entry(t, a, event="started", world=version, slice=s, restored_step=start) for s, a in members.items()]
    for i, step in enumerate(saves):
        events += [
            entry(t + i + 1, a, event="checkpoint", step=step, world=version, slice=s) for s, a in members.items()
        ]
    return events


def timeline(second_from: int = 11, loss: float = REF_LOSS + 0.001) -> list[dict[str, Any]]:
    """2 -> 1 -> 2 slices: slice 0 (attempt 1) preempted at step 11, slice 1 (attempt 2) trains on alone, slice 0's
    replacement (attempt 3) joins at step 20; the job completes at step 30."""
    return [
        {"t": 0.0, "kind": "submitted"},
        *world(1.0, 1, {0: 1, 1: 2}, 0, [5, 10, 11]),
        *world(10.0, 2, {1: 2}, second_from, [15, 20]),
        *world(20.0, 3, {0: 3, 1: 2}, 20, [25, 30]),
        entry(30.0, 2, event="completed", step=30, final_loss=loss, params_sha256=OTHER_SHA, world=3, slice=1),
    ]


def report(events: list[dict[str, Any]], sha: str | None = REF_SHA, slices: int = 2) -> dict[str, Any]:
    from localcloud.machines.slices import LocalSlice

    kw: dict[str, Any] = dict(machines_left=0, leftover_processes=0, price=None, timed_out=False)
    return build(
        events=events,
        job={"job_id": "world", "status": "SUCCEEDED"},
        reference_sha=sha,
        machine_slice=LocalSlice(2, 4),
        slices=slices,
        reference_loss=REF_LOSS,
        **kw,
    )


def test_the_report_shows_each_world_with_its_members_and_the_step_it_started_from() -> None:
    events = timeline()
    assert [(w["version"], w["members"], w["from"]) for w in world_rows(events)] == [
        (1, [0, 1], 0),
        (2, [1], 11),
        (3, [0, 1], 20),
    ]
    text = render(report(events))
    assert text.splitlines()[0] == "job world (2 slices x 2 hosts): SUCCEEDED"
    assert "  worlds   v1 [0,1] from 0 -> v2 [1] from 11 -> v3 [0,1] from 20" in text
    assert "  slices   2 slices x 2 hosts: 4 trainer processes" in text


def test_a_world_that_trained_on_fewer_slices_is_data_exact_within_the_stated_tolerance() -> None:
    """Params that differ from the reference's (other members: other sums) but every step once and the final loss
    within 1e-3 relative: data-exact, `exact` stays the bitwise bool."""
    r = report(timeline())
    assert r["exact"] is False and r["exactness"] == "data-exact" and r["loss_tolerance"] == 1e-3
    line = next(line for line in render(r).splitlines() if line.startswith("  exact"))
    assert (
        line.startswith("  exact    data-exact: steps 1..30 each trained once, in order") and "0.001 relative" in line
    )
    far = report(timeline(loss=REF_LOSS * 1.01))  # 1% off: not within the tolerance
    assert far["exactness"] == "no" and "  exact    NO: params bbbb" in render(far)


def test_only_a_chain_of_saves_is_data_exact_and_only_in_a_world() -> None:
    """A world that started from a step no save holds broke the chain; a job of one slice runs the reference's
    arithmetic, so a differing hash there is no, whatever the loss."""
    assert report(timeline(second_from=12))["exactness"] == "no"
    assert not steps_once(world_rows(timeline()), {5, 10, 11, 15, 20, 25}, 30)  # the final step never saved
    one_slice = [e for e in timeline() if e["kind"] != "entry" or "world" not in e["payload"]]
    one_slice.append(entry(30.0, 1, event="completed", step=30, final_loss=REF_LOSS, params_sha256=OTHER_SHA))
    r = report(one_slice, slices=1)
    assert r["exactness"] == "no" and r["worlds"] == [] and render(r).splitlines()[0] == "job world: SUCCEEDED"


def test_bitwise_and_unknown_keep_their_words() -> None:
    same = timeline()
    same[-1] = {**same[-1], "payload": {**same[-1]["payload"], "params_sha256": REF_SHA}}
    r = report(same)
    assert r["exact"] is True and r["exactness"] == "bitwise" and "  exact    yes: params aaaa" in render(r)
    unknown = report(timeline(), sha=None)
    assert unknown["exact"] is None and unknown["exactness"] == "unknown"


def test_a_world_restarted_from_its_last_save_counts_the_steps_trained_again() -> None:
    """The same attempts in a new world (a crash: every member restarts from the last save) lose the steps past it,
    counted once however many member slices say they started."""
    events = [
        *world(1.0, 1, {0: 1, 1: 2}, 0, [5, 10, 15]),
        *({"t": 5.0 + s / 100, "kind": "step", "machine": "world-a1", "attempt": 1, "step": s} for s in (16, 17, 18)),
        *world(10.0, 2, {0: 1, 1: 2}, 15, [20]),
    ]  # fmt: skip
    assert lost_steps(sorted(events, key=lambda e: e["t"])) == 3


def test_a_worlds_reference_is_keyed_by_its_slice_count_and_serves_world_1_of_every_slice() -> None:
    """The reference of a job of K slices is the uninterrupted world of all K: its own cache key (one slice keeps the
    key it had), and a metadata server whose `respawn-world` key the trainer reads as world 1 with a coordinator."""
    from localcloud.machines.slices import LocalSlice
    from localcloud.reference import reference_key, world_metadata
    from respawn_trainer.world import read_world

    shape = LocalSlice(2, 4)
    one = reference_key([], {}, shape)
    assert one == reference_key([], {}, shape, slices=1) != reference_key([], {}, shape, slices=2)
    with world_metadata(1) as none:
        assert none == {}
    with world_metadata(3) as env:
        found, _ = read_world(env["RESPAWN_METADATA_URL"])
    assert env["RESPAWN_WORLD_VERSION"] == "1" and found is not None
    assert (found.version, found.members, found.step) == (1, (0, 1, 2), None)
    assert found.coordinator and found.coordinator.startswith("127.0.0.1:")
    assert found.ids(2) == {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3, (2, 0): 4, (2, 1): 5}


def test_a_worlds_goodput_is_counted_on_paid_slice_time() -> None:
    """Every slice of a world trains at once, each sending its own split: productive slice-seconds over the seconds
    its slices' machines were paid; a job of one slice keeps productive over wall time."""
    from localcloud.readout.report import _goodput

    assert _goodput(productive_s=150.0, wall_s=100.0, paid_s=200.0, slices=2) == 0.75
    assert _goodput(productive_s=80.0, wall_s=100.0, paid_s=300.0, slices=1) == 0.8
