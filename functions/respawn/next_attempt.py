"""Where the next attempt goes: its tier first (back to Spot, on to the next tier, or the same), then its zone.

Pure, like decide: decide's rules (and respawn.transitions, where they end) say *that* a machine is requested, this
room says *where*. With an outlook (respawn.outlook.Outlook: the deployment's preemption history, advice, prices)
and the job's `placement: ranked`, the zone is the best-ranked of the tier's zones not yet tried in the current walk
of stockouts, a zone that just interrupted the job penalised, and the same zone again after a crash; without an
outlook, or with `placement: ordered`, the list's order: the same zone after a preemption or a crash, the next zone
after a stockout.

A tier moves on when one of its rules holds (MOVE_ON_RULES: enough preemptions on it, a stockout long enough, the
deadline near); a later tier that is not Spot goes back to the first Spot tier when the outlook expects Spot to
last (`spot_tier_to_return_to`). An example sequence, tiers [spot (a, b), standard (a)] with `after_stockout`:
a stockout in a, then in b: the walk is over; once the stockout has lasted `after_stockout` the next attempt is on
the standard tier in a; hours later, with Spot's best zone expected to last `Policy.spot_min_mtbi_s`, back to spot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from respawn.jobs import COUNTED_AS_PREEMPTION, NO_CAPACITY, SPOT_MODELS, Attempt, EndReason, Job, Tier, machine_name
from respawn.outlook import Placed
from respawn.policy import Context
from respawn.prices import advice_source, machine_price, rate_per_h


def new_attempt(
    job: Job, now: float, ctx: Context, zone_index: int, *, same_zone: bool = False, avoid: str | None = None
) -> tuple[Job, Attempt]:
    """The next attempt: its tier first (back to Spot, or on to the next tier when it is time, else this one), then
    its zone. In list order (no outlook, or placement ordered) that is `zone_index` of the tier, or a new tier's first
    zone; ranked, the outlook's best zone not yet tried in this walk, or the same zone again for a `same_zone` retry
    in the same tier. Zone `avoid` (a head start's dying machine's) is taken only when the tier has no other."""
    spec = job.spec
    assert spec is not None
    tier = spot_tier_to_return_to(job, now, ctx)
    tier = tier if tier is not None else next_tier(job, now)
    if tier is not None:
        job, zone_index, same_zone = replace(job, tier_index=tier, capacity_round=0), 0, False
    zones, outlook, offered = job.current_tier.zones, ctx.outlook, offered_zones(job)
    if len(zones) > 1 and zones[zone_index] == avoid:
        zone_index = (zone_index + 1) % len(zones)
    while offered and zones[zone_index] not in offered:  # a zone that does not offer the machine is skipped
        zone_index = (zone_index + 1) % len(zones)
    reason, mtbi, price = "", None, None
    if outlook is not None:
        if _ranked(job) and not same_zone:
            placed, reason = _best_untried(job, now, ctx, avoid)
            zone_index = zones.index(placed.zone)
        else:
            why = "the same zone: a crash says nothing of the zone" if same_zone else "list order (placement ordered)"
            reason = f"{zones[zone_index]}: {why}"
        kind, provisioning = spec.machine_of(job.tier_index).type_name, job.current_tier.provisioning
        mtbi = outlook.mtbi_s(zones[zone_index], kind, provisioning, now)
        advised = outlook.advised_price(zones[zone_index], kind, provisioning)
        price = None if advised is None else {"per_h": advised[0], "source": advice_source(advised[1])}
    n = job.current.n + 1 if job.current else 1
    attempt = Attempt(
        n=n,
        zone=zones[zone_index],
        machine=machine_name(job.job_id, n),
        requested_at=now,
        tier=job.tier_index,
        zone_reason=reason,
        mtbi_s=mtbi,
        price=price,
    )
    return replace(job.with_attempt(attempt), zone_index=zone_index, next_attempt_at=None), attempt


def _ranked(job: Job) -> bool:
    return job.spec is not None and job.spec.placement == "ranked"


def _ranking(job: Job, now: float, ctx: Context) -> tuple[Placed, ...]:
    """The current tier's zones, best first by the outlook; a zone that just interrupted the job is penalised (the
    newest end of a preempted or lost attempt of the job there), and one that just had no capacity for it more."""
    assert job.spec is not None and ctx.outlook is not None
    machine, tier, outlook = job.spec.machine_of(job.tier_index), job.current_tier, ctx.outlook
    interrupted = {a.zone: a.ended_at for a in job.attempts if a.end_reason in COUNTED_AS_PREEMPTION and a.ended_at}
    ranking = outlook.rank(
        tier.zones,
        now,
        machine_type=machine.type_name,
        provisioning=tier.provisioning,
        list_price_per_hour=rate_per_h(tier.provisioning, machine_price(dict(machine.__dict__))),
        restart_cost_s=ctx.policy.restart_cost_s,
        just_interrupted=interrupted,
        just_refused=_refused(job),
    )
    return ranking.placed


def _refused(job: Job) -> dict[str, float]:
    """The zones that had no capacity for the job: when each last refused it."""
    return {a.zone: a.ended_at for a in job.attempts if a.end_reason in NO_CAPACITY and a.ended_at}


def _best_untried(job: Job, now: float, ctx: Context, avoid: str | None = None) -> tuple[Placed, str]:
    """The best-ranked zone not tried in the current walk of stockouts (nor `avoid`, while another is left), and the
    one-line reason: its figures, the runner-up's, the zones skipped as tried, and what the outlook lacked. A zone
    that once refused the job and still ranks below `avoid` (the refusal's penalty outweighs the interruption's) is
    no other zone to go to: a head start would wait in its queue while the dying zone had capacity a moment ago."""
    assert ctx.outlook is not None
    placed = _ranking(job, now, ctx)
    tried, offered = _tried_in_walk(job), offered_zones(job)
    placed = tuple(p for p in placed if p.zone in offered) or placed
    untried = [p for p in placed if p.zone not in tried] or list(placed)
    dying = next((p.score for p in untried if p.zone == avoid), None)
    refused = _refused(job)
    elsewhere = [
        p for p in untried if p.zone != avoid and not (p.zone in refused and dying is not None and p.score < dying)
    ] or untried
    best = elsewhere[0]
    reason = f"{best.reason}"
    if len(elsewhere) > 1:
        reason += f"; runner-up {elsewhere[1].zone} at {elsewhere[1].score:.3f} useful h/$"
    if tried:
        reason += f"; no capacity this walk in {', '.join(sorted(tried))}"
    if dying is not None and best.zone == avoid and len(untried) > 1:
        reason += f"; {avoid} again, its machine on notice: every other zone just had no capacity for the job"
    elif dying is not None and best.zone != avoid:
        reason += f"; not {avoid}: its machine is on notice"
    notes = [n for n in (ctx.outlook.note, _advice_note(job, ctx)) if n]
    return best, reason + "".join(f"; {n}" for n in notes)


def _advice_note(job: Job, ctx: Context) -> str | None:
    assert job.spec is not None and ctx.outlook is not None
    advice = ctx.outlook.advice.get((job.spec.machine_of(job.tier_index).type_name, job.current_tier.provisioning))
    return advice.note if advice is not None else None


def _tried_in_walk(job: Job) -> set[str]:
    """The zones of the current tier that found no capacity since the last full walk of its offered zones."""
    walked, offered = _walked(job), offered_zones(job)
    walk = len(walked) % len(offered) if offered else 0
    return {a.zone for a in walked[len(walked) - walk :]} if walk else set()


def unoffered(job: Job, tier: int | None = None) -> dict[str, str]:
    """The zones known not to offer tier `tier`'s machine (default: the current tier's; a create there was refused
    for it): zone -> the API's words. Like a stockout that never ends, each is skipped from then on, by every tier
    that runs that machine; a tier of another machine may still find it there."""
    assert job.spec is not None
    machine = job.spec.machine_of(job.tier_index if tier is None else tier)
    return {
        a.zone: a.error
        for a in job.attempts
        if a.end_reason == EndReason.UNOFFERED and job.spec.machine_of(a.tier) == machine
    }


def offered_zones(job: Job) -> tuple[str, ...]:
    """The current tier's zones but those known not to offer its machine."""
    skipped = unoffered(job)
    return tuple(z for z in job.current_tier.zones if z not in skipped)


def _walked(job: Job) -> tuple[Attempt, ...]:
    """The newest run of attempts without capacity in the current tier, in its offered zones only."""
    offered = offered_zones(job)
    streak = no_capacity_streak(job)
    return tuple(a for a in job.attempts[len(job.attempts) - streak :] if streak and a.zone in offered)


def walk_over(job: Job) -> bool:
    """Every offered zone of the tier had no capacity in the current walk (the newest attempt among them): time to
    back off, or to move on. Zones that do not offer the machine are not walked."""
    walked, offered = _walked(job), offered_zones(job)
    return not offered or (bool(walked) and len(walked) % len(offered) == 0)


def spot_tier_to_return_to(job: Job, now: float, ctx: Context) -> int | None:
    """The first Spot tier, when a job on a later tier that is not Spot goes back to it: the tier's
    back_to_spot_after has passed since the job came to it, the Spot tier's deadline rule would not move it on again
    at once, and the outlook expects Spot's best zone to last at least Policy.spot_min_mtbi_s. Never without an
    outlook."""
    spec = job.spec
    if ctx.outlook is None or spec is None:
        return None
    tier = job.current_tier
    if tier.provisioning in SPOT_MODELS or tier.back_to_spot_after_s is None:
        return None
    spot = next((i for i, t in enumerate(spec.all_tiers[: job.tier_index]) if t.provisioning in SPOT_MODELS), None)
    if spot is None or now - on_tier_since(job, now) < tier.back_to_spot_after_s:
        return None
    spot_tier = spec.all_tiers[spot]
    if spot_tier.deadline_within_s is not None and job.deadline - now <= spot_tier.deadline_within_s:
        return None
    best = _ranking(replace(job, tier_index=spot), now, ctx)[0]
    return spot if best.mtbi_s >= ctx.policy.spot_min_mtbi_s else None


def _stint(job: Job) -> tuple[Attempt, ...]:
    """The attempts since the job last went back to Spot: within a stint, tiers only move forward."""
    attempts, start = job.attempts, 0
    for i in range(1, len(attempts)):
        if attempts[i].tier < attempts[i - 1].tier:
            start = i
    return attempts[start:]


def on_tier_since(job: Job, now: float) -> float:
    """When the job came to its current tier: the request of the stint's first attempt on it (`now` if none yet)."""
    return next((a.requested_at for a in _stint(job) if a.tier == job.tier_index), now)


def next_tier(job: Job, now: float) -> int | None:
    """The tier the next attempt must use when one of the current tier's move-on rules holds (the last tier stays)."""
    assert job.spec is not None
    tiers, index = job.spec.all_tiers, job.tier_index
    while index + 1 < len(tiers) and any(rule(job, tiers[index], index, now) for rule in MOVE_ON_RULES):
        index += 1
    return index if index != job.tier_index else None


# A tier's move-on rule: (job, tier, its index, now) -> whether the job leaves that tier for the next one.
MoveOnRule = Callable[[Job, Tier, int, float], bool]


def _preempted_enough(job: Job, tier: Tier, index: int, now: float) -> bool:
    """`after_preemptions`: the tier's machines were taken this often in the current stint."""
    if tier.after_preemptions is None:
        return False
    mine = [a for a in _stint(job) if a.tier == index]
    return sum(a.end_reason in COUNTED_AS_PREEMPTION for a in mine) >= tier.after_preemptions


def _stocked_out_long_enough(job: Job, tier: Tier, index: int, now: float) -> bool:
    """`after_stockout`: the current tier has found no capacity anywhere, attempt after attempt, for this long."""
    if tier.after_stockout_s is None or index != job.tier_index:
        return False
    streak = no_capacity_streak(job)
    return bool(streak) and now - job.attempts[-streak].requested_at >= tier.after_stockout_s


def _deadline_near(job: Job, tier: Tier, index: int, now: float) -> bool:
    """`deadline_within`: the job's TTL deadline is this close."""
    return tier.deadline_within_s is not None and job.deadline - now <= tier.deadline_within_s


def _offered_nowhere(job: Job, tier: Tier, index: int, now: float) -> bool:
    """None of the tier's zones offers its machine (each refused a create for it)."""
    return set(tier.zones) <= unoffered(job, index).keys()


MOVE_ON_RULES: tuple[MoveOnRule, ...] = (_preempted_enough, _stocked_out_long_enough, _deadline_near, _offered_nowhere)


def no_capacity_streak(job: Job) -> int:
    """How many attempts in a row, newest first, found no capacity (in the current tier)."""
    streak = 0
    for attempt in reversed(job.attempts):
        if attempt.end_reason not in NO_CAPACITY or attempt.tier != job.tier_index:
            break
        streak += 1
    return streak
