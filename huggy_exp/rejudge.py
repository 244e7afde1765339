"""Re-judge stored results under the limits table as composed now, without running the policy (`mode=rejudge`).

What a point's verdict rests on is in its result.json: every figure the engine judged against CPU fp64 is stored with
the limit beside it (`<stem>/vs_fp64/<metric>` and `<metric>_limit`, verify.py), and precision's layers likewise
(`layer/<part>/rel_rmse`). Those checks are applied again with the limits of the point's dtype on its device kind;
everything else a mode judged (NaN/inf, benchmark's gate against eager, onnx-compare's against onnxruntime, batch
invariance, sampling tests, precision's relative ratio) stands as recorded. A check the stored figures cannot decide
(an rtol > 0 needs every element; a new discrete margin needs every flip's margin) is an error naming what is missing.
A port bundle keeps every array: its points are compared again by verify.compare, under the limits they were recorded
with and under the table now.
"""

from __future__ import annotations

import math
import re

from huggy_exp.bundle import DISTRIBUTIONS, slug
from huggy_exp.config import limit_row
from huggy_exp.errors import UserError
from huggy_exp.numerics import limits_for
from huggy_exp.verify import DECLARED, Limits, Rules, compare, within

# the engine's judged figures: metric -> (its limit in verify.limits, how it is held: "<=" at most, ">=" at least)
CHECKS = {"max_abs": ("max_abs", "<="), "cosine_min_row": ("cosine_min", ">="), "kl_max": ("kl_max", "<="),
          "mean_shift_sigma_max": ("mean_shift_max", "<="), "rel_rmse": ("layer_rel_rmse", "<=")}
JUDGED = re.compile(r"^(?:(?P<stem>\w+)/vs_fp64|layer/(?P<layer>\w+))/(?P<metric>\w+)_limit$")
OWN_FAILURES = ("vs cpu fp64: ", "layer ")  # how verify_point's and precision's layer failures begin (result.fail)


def checks(metrics: dict) -> list[dict]:
    """The stored judged figures: {key, metric (limit key), op, value, limit, scale} per `<...>_limit` the engine wrote."""
    found = []
    for key, limit in metrics.items():
        match = JUDGED.match(key)
        if match is None or match["metric"] not in CHECKS:
            continue
        value_key = key[: -len("_limit")]
        name, op = CHECKS[match["metric"]]
        scale = metrics.get(f"{match['stem']}/vs_fp64/max_abs_scale", 1.0) if match["stem"] == "memories" and name == "max_abs" else 1.0
        found.append({"key": value_key, "limit_key": name, "op": op, "value": metrics.get(value_key), "limit": limit,
                      "scale": scale, "memory": match["stem"] == "memories" and name == "max_abs"})
    return found


def holds(value, op: str, bound) -> bool:
    """The engine's comparison: within(value, bound) for "<=", value >= bound for ">="; NaN or missing never holds."""
    if op == "<=":
        return within(value, bound)
    v = float("nan") if value is None else float(value)
    return math.isfinite(v) and v >= float(bound)


def moved(c: dict, was: float, now: float) -> dict:
    """A check held to the limit `was` before and `now` after: a row of a verdict's `changed`."""
    return {"check": c["key"], "value": c["value"], "op": c["op"], "was": was, "now": now,
            "held_before": holds(c["value"], c["op"], was), "holds_now": holds(c["value"], c["op"], now)}


def rejudge(record: dict, table: dict, specialize: dict, where: str) -> dict:
    """A point's verdict under `table` (verify.limits as composed now): the new status, reason and the checks that
    changed; raises UserError naming the figure a new limit needs and the record lacks."""
    metrics = record.get("metrics") or {}
    plan = record.get("plan") or {}
    if plan and not plan.get("limits"):
        raise UserError(f"{where}: its precision plan {plan.get('name')} records no limits dtype: re-run the point")
    judged = plan.get("limits") or record["dtype"]  # a plan is judged by its lowest dtype's limits (or its own)
    row = limit_row(judged, record.get("precision_mode"))  # TF32/HF32 points: their mode's row
    new = limits_for(table, row, record["device"], specialize, "verify.limits")
    found, failing_before, failing_now, changed = checks(metrics), [], [], []
    for c in found:
        if c["value"] is None:
            raise UserError(f"{where}: {c['key']} is missing beside {c['key']}_limit: its verdict cannot be re-judged")
        if c["memory"] and f"{c['key']}_scale" not in metrics:
            raise UserError(f"{where}: {c['key']}_scale is missing (memories are held to max_abs x max(1, |memory|)): "
                            "re-run the point to re-judge its memories under another limit")
        m = moved(c, c["limit"], new[c["limit_key"]] * c["scale"])
        failing_before += [c] if not m["held_before"] else []
        failing_now += [c] if not m["holds_now"] else []
        changed += [m] if m["held_before"] != m["holds_now"] or m["now"] != m["was"] else []
    _decidable(metrics, new, failing_now, where)
    status, reason = record["status"], record.get("reason") or ""
    if status not in ("passed", "failed") or not found:
        return {"status": status, "reason": reason, "checks": len(found), "changed": changed, "rejudged": False,
                "limits": {}}
    parts = [p for p in reason.split("; ") if p]
    others = [p for p in parts if not p.startswith(OWN_FAILURES)]  # failures no limit of the table decided: they stand
    if status == "failed" and len(parts) - len(others) != len(failing_before):
        others = parts  # the stored failures do not line up with the stored checks: nothing is taken back
    said = [f"{c['key']} {c['value']:.3g} {'>' if c['op'] == '<=' else '<'} {new[c['limit_key']] * c['scale']:g} (re-judged)"
            for c in failing_now]
    now_failed = bool(others or failing_now or (status == "failed" and not failing_before))
    return {"status": "failed" if now_failed else "passed", "reason": "; ".join(others + said) if now_failed else "",
            "checks": len(found), "changed": changed, "rejudged": True,
            "limits": {f"{c['key']}_limit": new[c["limit_key"]] * c["scale"] for c in found}}


def _decidable(metrics: dict, new: dict, failing: list[dict], where: str) -> None:
    """What the stored figures cannot decide: an element-wise rtol (its over-tolerance count needs the elements) where
    max_abs alone does not hold, and a discrete margin that would excuse or condemn flips (each flip's margin)."""
    if new.get("rtol", 0.0) and any(c["limit_key"] == "max_abs" and not c["memory"] for c in failing):
        raise UserError(f"{where}: verify.limits rtol={new['rtol']:g} needs every element's error (|x - ref| <= atol + "
                        "rtol |ref|), which result.json does not keep; re-judge with rtol 0 or re-run the point")
    for key, flips in metrics.items():
        stem = key.split("/vs_fp64/")[0]
        if key.endswith("/vs_fp64/flips") and flips and metrics.get(f"{stem}/vs_fp64/margin_limit") != new["margin"]:
            raise UserError(f"{where}: {key}={flips:g} and a new margin {new['margin']:g}: whether each flip is excused "
                            "needs its masked-logit margin, which result.json does not keep; re-run the point")


# --- a port bundle (bundle.py): its points judged again from their own arrays by the one engine (verify.compare)


NEEDS = {"actions": ("mu", "log_sigma", "KL and |Δμ|/σ"), "discrete_actions": ("masked_logits", "KL and the margin")}


def bundle_points(b, table: dict, specialize: dict, rel_floor: float) -> list[tuple[str, dict, dict]]:
    """Every point of bundle `b` as (its key, the record it was, its verdict); raises UserError naming what the bundle
    lacks to re-judge it (one recorded before this mode)."""
    reference = b.reference(distributions=True)
    expected = named(reference)
    sizes = tuple(b.manifest["model"].get("dims", {}).get("branch_sizes") or ())
    found = []
    for key, point in b.points.items():
        outputs = b.outputs(key, distributions=True)
        missing = [f"{what} (fp64's {' and '.join(names)})" for stem, (*names, what) in NEEDS.items()
                   if stem in outputs and not all(n in reference for n in names)]
        missing += [] if "judged" in point else ["the limits it was recorded under"]
        if missing:
            raise UserError(f"bundle {b.root} point {key}: {missing[0]} not in the bundle (format version "
                            f"{b.manifest['format_version']}): re-record it to re-judge it")
        judged = point["judged"]
        limits = Limits(**judged["limits"]), Limits.of(limits_for(table, judged["row"], point["device"], specialize,
                                                                  "verify.limits"))
        then, now = (compare(named(outputs), expected, Rules(lim, judged["dtype"], rel_floor, branch_sizes=sizes))
                     for lim in limits)
        record = as_record(b, key, point)
        record.update(status=passed_or_failed(then), reason=said(then), metrics={**record["metrics"], **then.metrics("fp64")})
        found.append((key, record, verdict(then.metrics("fp64"), now.metrics("fp64"), now)))
    return found


def verdict(was: dict, new: dict, now) -> dict:
    """rejudge()'s verdict of a point the engine compared again (`now`, its figures `new`), its figures before `was`."""
    rows = [moved(c, was[f"{c['key']}_limit"], c["limit"]) for c in checks(new)]
    return {"status": passed_or_failed(now), "reason": said(now), "checks": len(rows), "rejudged": True, "limits": new,
            "changed": [r for r in rows if r["was"] != r["now"] or r["held_before"] != r["holds_now"]]}


def passed_or_failed(comparison) -> str:
    return "passed" if comparison.passed else "failed"


def said(comparison) -> str:
    return "; ".join(f"vs cpu fp64: {why}" for why in comparison.failures)  # as verify_point fails a point


def as_record(b, key: str, point: dict) -> dict:
    """What a result.json of the point would say: its run name, where it ran, model, observations, fingerprints."""
    m, obs = b.manifest["model"], b.manifest["observations"]
    preset = {k: obs.get(k) for k in ("source", "rows", "scale", "path")}
    return {"mode": "record", "run_name": f"record-{slug(key)}", "device": point["device"], "dtype": point["dtype"],
            "batch_size": point["batch"], "seed": obs.get("seed"), "bundle": str(b.root), "point": key,
            "params": {"backend": point["backend"], "obs": preset},
            "model": {"path": m.get("path"), "sha256": m.get("file_sha256"), "weights_sha256": m.get("sha256"),
                      "synthetic": m.get("synthetic"), "step": m.get("step")},
            "tags": dict(point["fingerprints"]), "latency": point["latency"],
            "metrics": {f"latency/{k}": v for k, v in point["latency"].items()}}


def named(arrays: dict) -> dict:
    """A bundle's arrays by ML-Agents name, as the engine compares them (the distributions keep their own names)."""
    return {**{o.name: arrays[o.stem] for o in DECLARED if o.stem in arrays},
            **{k: v for k, v in arrays.items() if k in DISTRIBUTIONS}}
