"""What the report says of a job of several slices (a *world*, docs/design/several-slices.md): how its membership
changed, and how exact its result is beside the uninterrupted reference run (pure functions over the timeline).

  worlds      one row per world that trained, in version order: `version`, `members` (slice indices) and `from`, the
              step it restored. From the trainers' `started` entries (each member slice's first host sends one,
              with `world`, `slice` and `restored_step`): a version the control plane announced but that never
              formed (superseded while a replacement was joining) trained nothing and has no row
  exactness   "bitwise": the final params_sha256 is the reference's (`exact` true). "data-exact": a world whose
              params differ (some steps trained with other members, so the gradient's sums ran in another order)
              but every step 1..final trained into the final parameters once, in order (`steps_once`), and the final
              loss within LOSS_TOLERANCE (relative) of the reference's. "no": neither. "unknown": no reference hash
              (`exact` null). Only a world can be data-exact: a job of one slice runs the reference's arithmetic, so
              a differing hash there is a fault, never a tolerance.
"""

from __future__ import annotations

from typing import Any

LOSS_TOLERANCE = 1e-3  # relative, the final loss beside the reference's (the nano model in float32: trainer/README.md)


def world_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each world that trained: its version, member slices and the step it restored (see `worlds` above)."""
    found: dict[int, dict[str, Any]] = {}
    for e in events:
        payload = e["payload"] if e["kind"] == "entry" else {}
        if payload.get("event") != "started" or not isinstance(payload.get("world"), int):
            continue
        row = found.setdefault(
            payload["world"], {"version": payload["world"], "members": [], "from": payload.get("restored_step") or 0}
        )
        if isinstance(payload.get("slice"), int) and payload["slice"] not in row["members"]:
            row["members"] = sorted([*row["members"], payload["slice"]])
    return [found[v] for v in sorted(found)]


def saved_steps(events: list[dict[str, Any]]) -> set[int]:
    """Every step a trainer reported saved (a `checkpoint`, or the save its `stopped`/`completed` says)."""
    return {
        int(e["payload"]["step"])
        for e in events
        if e["kind"] == "entry"
        and e["payload"].get("event") in ("checkpoint", "stopped", "completed")
        and isinstance(e["payload"].get("step"), int)
    }


def steps_once(worlds: list[dict[str, Any]], saved: set[int], final_step: int | None) -> bool:
    """Whether the final parameters hold every step 1..final_step once, in order. The parameters a world ends with
    are those it restored plus the steps it trained after, so they chain: the first world starts from nothing (step
    0), each later one from a step an earlier one saved (a step no save holds would be a gap in the chain: trained
    into nothing the next world kept), and the last one saved the final step. Steps a world trained past the save
    its successor restored (a crash between saves) are trained again, but only once into what is kept."""
    if not worlds or final_step is None or worlds[0]["from"] != 0 or final_step not in saved:
        return False
    starts = [int(w["from"]) for w in worlds]
    return all(s in saved for s in starts[1:]) and max(starts) <= final_step


def exactness_fields(
    *,
    events: list[dict[str, Any]],
    sha: str | None,
    reference: dict[str, Any],
    final_step: int | None,
    final_loss: float | None,
    slices: int,
) -> dict[str, Any]:
    """The report's `exact` (a bool for the bitwise case, null when unknown), `exactness`, `exact_reason`, the
    reference's final loss and the tolerance, and the `worlds` rows with the job's slice count."""
    reference_sha, note = reference.get("sha"), reference.get("note") or "no reference run"
    reference_loss = reference.get("final_loss")
    worlds = world_rows(events)
    exact = None if reference_sha is None else bool(sha) and sha == reference_sha
    exactness = "unknown" if exact is None else "bitwise" if exact else "no"
    once = exactness == "no" and bool(worlds) and steps_once(worlds, saved_steps(events), final_step)
    if once and within(final_loss, reference_loss):
        exactness = "data-exact"
    return {
        "exact": exact,
        "exactness": exactness,
        "exact_reason": note if reference_sha is None else None,
        "reference_final_loss": reference_loss,
        "loss_tolerance": LOSS_TOLERANCE,
        "slices": slices,
        "worlds": worlds,
    }


def within(loss: float | None, reference_loss: float | None) -> bool:
    """The final loss within LOSS_TOLERANCE of the reference's, relative to it (both known and finite)."""
    if not isinstance(loss, int | float) or not isinstance(reference_loss, int | float):
        return False
    return abs(float(loss) - float(reference_loss)) <= LOSS_TOLERANCE * abs(float(reference_loss))


def shape_words(slices: int, hosts: int) -> str:
    """`2 slices x 2 hosts` for the report's header; empty for a job of one slice, whose header stays as it was."""
    if slices <= 1:
        return ""
    return f"{slices} slices x {hosts} host{'s' if hosts != 1 else ''}"


def worlds_line(r: dict[str, Any]) -> str | None:
    """`  worlds   v1 [0,1] from 0 -> v2 [1] from 11 -> ...`; None for a report without worlds."""
    rows = r.get("worlds") or ()
    if not rows:
        return None
    return "  worlds   " + " -> ".join(
        f"v{w['version']} [{','.join(str(m) for m in w['members'])}] from {w['from']}" for w in rows
    )


def slice_line(r: dict[str, Any]) -> str:
    """The line about the world's processes: every host of every member slice is one trainer process."""
    slices, hosts = int(r.get("slices") or 1), int(r.get("hosts") or 1)
    return f"  slices   {shape_words(slices, hosts)}: {slices * hosts} trainer processes in a world of every slice"


def exact_line(r: dict[str, Any]) -> str:
    """Whether the parameters are exact: bitwise, data-exact (saying its tolerance), NO, or unknown and why."""
    params, reference = str(r["params_sha256"])[:16], str(r["reference_sha256"])[:16]
    exactness = r.get("exactness") or ("unknown" if r["exact"] is None else "bitwise" if r["exact"] else "no")
    if exactness == "unknown":
        known = f" (params {r['params_sha256'][:16]})" if r["params_sha256"] else ""
        return f"  exact    unknown: {r['exact_reason']}{known}"
    if exactness == "data-exact":
        return (
            f"  exact    data-exact: steps 1..{r['final_step']} each trained once, in order; final loss "
            f"{r['final_loss']:.6g} vs the reference's {r['reference_final_loss']:.6g}, within "
            f"{r['loss_tolerance']:g} relative; params {params} differ from the uninterrupted reference {reference} "
            "(other members: the gradient's sums ran in another order)"
        )
    verdict = "yes" if exactness == "bitwise" else "NO"
    return f"  exact    {verdict}: params {params} vs uninterrupted reference {reference}"
