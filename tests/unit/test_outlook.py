"""placement: decayed preemption history, the pooled prior, the ranking, its penalty and ties, the JSON form."""

from __future__ import annotations

import json

import pytest

from respawn.jobs import GpuMachine, JobSpec, TpuMachine
from respawn.outlook import (
    DAY,
    HOUR,
    Advice,
    Exposure,
    History,
    Key,
    Outlook,
    ZoneAdvice,
    rank,
    useful_fraction,
)

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
GPU = "a2-highgpu-1g"
T0 = 1_000_000.0


def key(zone: str, provisioning: str = "spot") -> Key:
    return Key(zone, GPU, provisioning)


def ranked(history: History, now: float = T0, zones: tuple[str, ...] = (A, B, C), **kw: object) -> tuple[str, ...]:
    args: dict[str, object] = {"machine_type": GPU, "provisioning": "spot", "price_per_hour": 1.0}
    args.update(restart_cost_s=120.0)
    args.update(kw)
    return rank(zones, history, now, **args).zones  # type: ignore[arg-type]


def test_evidence_halves_every_half_life() -> None:
    h = History(half_life_s=DAY).observe(key(A), T0, seconds=8 * HOUR, interruptions=4)
    later = h.exposure(key(A), T0 + 2 * DAY)
    assert later.seconds == pytest.approx(2 * HOUR)
    assert later.interruptions == pytest.approx(1.0)
    again = h.observe(key(A), T0 + DAY, seconds=0, interruptions=1).exposure(key(A), T0 + DAY)
    assert again.interruptions == pytest.approx(3.0)  # 4 halved, plus the new one undecayed


def test_old_interruptions_fade_so_a_recovered_zone_climbs_back() -> None:
    bad_then = History(half_life_s=DAY).observe(key(A), T0, seconds=10 * HOUR, interruptions=20)
    calm_now = bad_then.observe(key(A), T0 + 10 * DAY, seconds=10 * HOUR, interruptions=0)
    assert calm_now.mtbi_s(key(A), T0 + 10 * DAY) > 5 * bad_then.mtbi_s(key(A), T0)


def test_a_zone_without_data_sits_between_the_best_and_the_worst() -> None:
    h = History().observe(key(A), T0, seconds=100 * HOUR, interruptions=1)
    h = h.observe(key(B), T0, seconds=100 * HOUR, interruptions=50)
    mtbi = {z: h.mtbi_s(key(z), T0) for z in (A, B, C)}
    assert mtbi[B] < mtbi[C] < mtbi[A]
    assert ranked(h, zones=(C, B, A)) == (A, C, B)


def test_with_no_data_at_all_the_prior_is_prior_hours_per_interruption() -> None:
    h = History(prior_interruptions=2.0, prior_hours=10.0)
    assert h.mtbi_s(key(A), T0) == pytest.approx(5 * HOUR)


def test_another_provisioning_model_is_separate_evidence() -> None:
    h = History().observe(key(A, "standard"), T0, seconds=1000 * HOUR)
    assert h.mtbi_s(key(A), T0) == pytest.approx(History().mtbi_s(key(A), T0))


def test_equal_scores_keep_the_given_order() -> None:
    assert ranked(History()) == (A, B, C)
    assert ranked(History(), zones=(C, A, B)) == (C, A, B)


def test_a_just_interrupting_zone_goes_last_and_comes_back_as_the_penalty_fades() -> None:
    h = History()
    assert ranked(h, T0 + 60, just_interrupted={A: T0}) == (B, C, A)
    assert ranked(h, T0 + 3 * HOUR, just_interrupted={A: T0}, penalty_half_life_s=HOUR)[-1] == A
    # after many half-lives the penalty is negligible but never exactly zero: A stays behind equal zones, yet ahead
    # of a zone that is measurably worse
    h = h.observe(key(B), T0, seconds=HOUR, interruptions=5).observe(key(C), T0, seconds=HOUR, interruptions=5)
    assert ranked(h, T0 + 20 * HOUR, just_interrupted={A: T0}, penalty_half_life_s=HOUR)[0] == A


def test_a_cheaper_zone_wins_at_equal_mtbi_and_the_reason_says_why() -> None:
    r = rank((A, B), History(), T0, machine_type=GPU, provisioning="spot", price_per_hour={A: 2.0, B: 1.0},
             restart_cost_s=60.0, just_interrupted={B: T0 - 2 * HOUR})  # fmt: skip
    assert r.zones == (B, A)  # half the price beats a faded penalty: x(1 - 0.8 * 0.5 ** 2) = x0.8
    assert len(r.placed) == 2 and all(p.reason.startswith(p.zone + ": MTBI") for p in r.placed)
    assert "interrupted this job 120 min ago (x0.80)" in r.placed[0].reason and "$2.00/h" in r.placed[1].reason


def test_useful_fraction_follows_young_daly() -> None:
    # M = 1 h, C = 18 s: tau = sqrt(2 * 18 * 3600) = 360 s; waste 18/360 + (0 + 180)/3600 = 0.1
    assert useful_fraction(HOUR, 18.0, 0.0) == pytest.approx(0.9)
    assert useful_fraction(60.0, 30.0, 120.0) == 0.0  # restarting costs more than the machine lives
    assert useful_fraction(1000 * HOUR, 30.0, 60.0) > useful_fraction(HOUR, 30.0, 60.0)


def test_json_round_trip_keeps_every_figure() -> None:
    h = History(half_life_s=2 * DAY, prior_interruptions=3.0, prior_hours=12.0)
    h = h.observe(key(A), T0, seconds=5 * HOUR, interruptions=2).observe(key(B, "standard"), T0 + 9, seconds=7.5)
    back = History.from_json(json.loads(json.dumps(h.to_json())))
    assert back == h
    assert back.mtbi_s(key(A), T0 + DAY) == h.mtbi_s(key(A), T0 + DAY)


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        History(half_life_s=0)
    with pytest.raises(ValueError, match=r"ZONE\|MACHINE_TYPE\|PROVISIONING"):
        History.from_json({"exposures": {"us-central1-a": {"seconds": 1, "interruptions": 0, "at": 0}}})
    with pytest.raises(ValueError, match="price_per_hour of us-central1-a"):
        ranked(History(), price_per_hour=0.0)
    with pytest.raises(ValueError, match="seconds and interruptions"):
        History().observe(key(A), T0, seconds=-1)


def test_exposure_never_grows_with_time() -> None:
    e = Exposure(100.0, 2.0, T0)
    assert e.decayed_to(T0 - 50, DAY) == Exposure(100.0, 2.0, T0)  # a clock behind the evidence decays nothing


def test_an_advice_uptime_is_one_more_interruption_of_prior_evidence() -> None:
    advice = Advice({A: ZoneAdvice(estimated_uptime_s=100 * HOUR)}, fetched_at=T0)
    outlook = Outlook(History(), advice={(GPU, "spot"): advice})
    # no history: the prior (24 h per interruption) and the advice (100 h per interruption) average
    assert outlook.mtbi_s(A, GPU, "spot", T0) == pytest.approx(62 * HOUR)
    assert outlook.mtbi_s(B, GPU, "spot", T0) == pytest.approx(24 * HOUR)
    assert outlook.mtbi_s(A, GPU, "standard", T0) == pytest.approx(24 * HOUR)  # advice is per provisioning model


def test_an_advice_price_replaces_the_list_price_and_every_figure_names_its_source() -> None:
    advice = Advice({B: ZoneAdvice(price_per_hour=0.5, obtainability=0.9)}, fetched_at=T0, note="preview API")
    r = Outlook(History(), advice={(GPU, "spot"): advice}).rank(
        (A, B), T0, machine_type=GPU, provisioning="spot", list_price_per_hour=1.0, restart_cost_s=60.0
    )
    assert r.zones == (B, A) and r.note == "preview API"
    assert "$0.50/h (advice), obtainability 0.90 (advice)" in r.placed[0].reason
    assert "$1.00/h (list price 2025-06)" in r.placed[1].reason and "MTBI 24.0h (history:" in r.placed[1].reason


def test_without_any_price_zones_rank_by_useful_fraction_and_the_outlook_note_is_said() -> None:
    h = History().observe(key(A), T0, seconds=HOUR, interruptions=4)
    r = Outlook(h, note="history unreadable").rank(
        (A, B), T0, machine_type=GPU, provisioning="spot", list_price_per_hour=None, restart_cost_s=60.0
    )
    assert r.zones == (B, A) and r.note == "history unreadable" and "(no price known)" in r.placed[0].reason


def test_the_history_keys_a_tpu_by_its_accelerator_type_and_a_gpu_by_its_machine_type() -> None:
    def spec(machine: TpuMachine | GpuMachine) -> JobSpec:
        return JobSpec("j", machine, (A,), "img", "gs://b/c")

    assert spec(TpuMachine("v6e-8", api="compute")).machine.type_name == "v6e-8"
    assert spec(GpuMachine("a3-highgpu-8g", "nvidia-h100-80gb", 8)).machine.type_name == "a3-highgpu-8g"
