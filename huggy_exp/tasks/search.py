"""`search`: the cheapest precision plan that passes every limit (docs/precision-plans.md).

Everything in the lowest candidate dtype is judged first. If it fails, each part alone in that dtype is scored against
CPU fp64 (its sensitivity: the worst of KL, |Δμ|/σ and max_abs over their limits), the parts are ranked by it, and the
fewest most-sensitive parts kept in fp32 are found by bisection over that ranking (onnxconverter-common's
auto_convert_mixed_precision bisects the same way); each kept part is then tried low again, most FLOPs first. Further
candidates try the parts still in fp32. The plan chosen is re-judged on a held-out split of the observations.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from huggy_exp import timing, verify
from huggy_exp.config import DTYPE_NAMES, SearchMode
from huggy_exp.context import Context
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.observations import make_feeds
from huggy_exp.placement import QUANTIZED, Plan, resolve
from huggy_exp.policy import Policy, has_linear
from huggy_exp.results import Result
from huggy_exp.runners import TorchRunner, reference, run_feeds
from huggy_exp.files import atomic_write_text
from huggy_exp.tasks import Task, batch_of, distributions, is_sequence

HIGH = "fp32"  # where a part the low dtypes cannot hold stays
CONF_PLANS = Path(__file__).resolve().parents[2] / "conf" / "plan"  # mode.save_as writes here
PLAN_NAME = re.compile(r"^[A-Za-z0-9_]+$")
SCORED = ("kl_max", "mean_shift_sigma_max", "max_abs")  # sensitivity: each over its limit, the worst output's


def lowest(dtypes: Iterable[str]) -> str:
    return min(dtypes, key=DTYPE_NAMES.index)


def uniform(parts: dict, dtype: str) -> dict[str, str]:
    """Every part in `dtype`, but for an int8 dtype the parts without a Linear layer (an LSTM), which stay fp32."""
    return {p: dtype if dtype not in QUANTIZED or has_linear(m) else HIGH for p, m in parts.items()}


class Judge:
    """Plans (part -> dtype) judged against CPU fp64 on one split of the observations by the verification engine and
    the limits of each plan's lowest dtype; each plan once: `evaluations` counts them."""

    def __init__(self, ctx: Context, feeds: dict[str, np.ndarray]):
        self.ctx, self.feeds, self.seen = ctx, feeds, {}
        ref = reference(ctx, "fp64")
        self.want = {**run_feeds(ref, feeds), **distributions(ref, feeds)}

    def runner(self, parts: dict[str, str]) -> TorchRunner:
        plan = Plan("search", tuple(parts.items()), lowest(parts.values()))
        ctx = self.ctx
        return TorchRunner(ctx.weights, resolve(ctx.device, ctx.dtype, plan), ctx.batch_size, ctx.backend)

    def __call__(self, parts: dict[str, str]) -> verify.Comparison:
        key = tuple(sorted(parts.items()))
        if key not in self.seen:
            runner = self.runner(parts)
            got = {**run_feeds(runner, self.feeds), **distributions(runner, self.feeds)}
            self.seen[key] = verify.compare(got, self.want, self.ctx.rules(lowest(parts.values())))
        return self.seen[key]


def figures(c: verify.Comparison) -> dict[str, float]:
    """The worst KL, |Δμ|/σ and max_abs over the outputs, and `sensitivity`: the largest of them over its limit."""
    out, ratios = {}, [0.0]
    for key in SCORED:
        found = [(o.metrics[key], o.metrics.get(f"{key}_limit")) for o in c.outputs.values() if key in o.metrics]
        if found:
            out[key] = max(float(v) for v, _ in found)
            ratios += [float(v) / lim if np.isfinite(v) else np.inf for v, lim in found if lim]
    return {**out, "sensitivity": max(ratios)}


def lower(judge: Judge, plan: dict[str, str], ranked: list[str], low: str, flops: dict[str, int]) -> dict[str, str] | None:
    """`plan` with the parts of `ranked` (most sensitive first) in `low` but for the fewest that must stay in fp32:
    the shortest kept prefix found by bisection, then each kept part tried low again, most FLOPs first. None when even
    all of them in fp32 fails."""
    def keep(k: int) -> dict[str, str]:
        return {**plan, **{p: HIGH if i < k else low for i, p in enumerate(ranked)}}

    if judge(keep(0)).passed:
        return keep(0)
    lo, hi = 1, len(ranked)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if judge(keep(mid)).passed else (mid + 1, hi)
    found = keep(lo)
    if not judge(found).passed:
        return None
    for part in sorted(ranked[:lo], key=flops.__getitem__, reverse=True):  # most FLOPs first: each one tried low
        if judge({**found, part: low}).passed:
            found = {**found, part: low}
    # as few parts in fp32, fewer FLOPs: each kept part (most FLOPs first) swapped for a low part of fewer FLOPs
    # (fewest first) where that passes
    for part in sorted([p for p in ranked if found[p] == HIGH], key=flops.__getitem__, reverse=True):
        lighter = (p for p, d in found.items() if d == low and flops[p] < flops[part])
        for other in sorted(lighter, key=flops.__getitem__):
            if judge({**found, part: low, other: HIGH}).passed:
                found = {**found, part: low, other: HIGH}
                break
    return found


def splits(ctx: Context) -> tuple[dict, dict, str]:
    """(search split, held-out split, what they are): a file's even and odd rows (a sequence's envs), else the
    observations of `seed` and of `seed + 1`."""
    feeds = ctx.feeds
    if ctx.obs.source != "file":
        held = make_feeds(ctx.obs.source, ctx.weights, ctx.obs.rows, ctx.seed + 1, ctx.obs.scale, ctx.obs.path)
        return feeds, held, f"search on seed {ctx.seed}, held out: seed {ctx.seed + 1} ({ctx.obs.rows} rows each)"
    axis = 1 if is_sequence(feeds) else 0
    rows = feeds["obs_0"].shape[axis]
    if rows < 2:
        raise UserError(f"mode=search needs two observation rows at least (a search and a held-out split); "
                        f"{ctx.obs.path} has {rows}")
    half = [{k: np.take(v, range(start, rows, 2), axis=axis) for k, v in feeds.items()} for start in (0, 1)]
    what = "envs" if axis else "rows"
    return half[0], half[1], f"search on the file's even {what}, held out: its odd {what} ({rows // 2} each)"


class SearchTask(Task):
    mode: SearchMode

    def run(self, ctx: Context) -> Result:
        # the job's dtype when it is below fp32, else bf16 (`mode=search` alone, dtype=fp32, searches bf16)
        default = ctx.dtype if DTYPE_NAMES.index(ctx.dtype) < DTYPE_NAMES.index(HIGH) else "bf16"
        asked = sorted(set(self.mode.candidates or [default]), key=DTYPE_NAMES.index)
        name = self.mode.save_as or f"search_{ctx.target().kind}_{'_'.join(asked)}"
        if not PLAN_NAME.match(name):
            raise UserError(f"mode.save_as={name!r}: a plan's name is letters, digits and _ (it names conf/plan/<name>.yaml)")
        if self.mode.save_as and (CONF_PLANS / f"{name}.yaml").exists():
            raise UserError(f"mode.save_as={name}: {CONF_PLANS / f'{name}.yaml'} exists; refused to replace it (choose another name)")
        search, held, split_words = splits(ctx)
        judge, parts = Judge(ctx, search), Policy(ctx.weights).parts()
        flops = {p: sum(2 * w.numel() for w in m.parameters() if w.dim() == 2) for p, m in parts.items()}
        candidates, notes = self._candidates(judge, parts, asked)
        # --- search: everything low first; else rank the parts and keep the fewest in fp32
        ranking, low = {}, candidates[0]
        fits = {c: [p for p, d in uniform(parts, c).items() if d == c] for c in candidates}
        plan, ranked = uniform(parts, low), fits[low]
        if not judge(plan).passed:
            ranking = {p: figures(judge({**{q: HIGH for q in parts}, p: low})) for p in fits[low]}
            ranked = sorted(fits[low], key=lambda p: -ranking[p]["sensitivity"])
            plan = lower(judge, {p: HIGH for p in parts}, ranked, low, flops)
        for low in candidates[1:]:  # the parts still in fp32 try the next candidate
            todo = [p for p in dict.fromkeys((*ranked, *parts)) if plan and plan[p] == HIGH and p in fits[low]]
            plan = plan and lower(judge, plan, todo, low, flops) if todo else plan
        plan = plan and {p: plan[p] for p in parts}
        evaluations = len(judge.seen)
        result = Result()
        if plan is None:
            result.fail(f"no plan passes: every part in {HIGH} fails {HIGH}'s own limits here")
            return result
        # --- the objective: the cheapest passing point, then the held-out split
        points, decided = self._points(ctx, judge, plan, candidates, flops)
        chosen = next(p for p in points if p["chosen"])
        held_out = Judge(ctx, held)(chosen["parts"])
        self._report(ctx, result, name, chosen, held_out, points, decided, split_words, evaluations, notes,
                     ranking, flops)
        return result

    def _candidates(self, judge: Judge, parts: dict, asked: list[str]) -> tuple[list[str], list[str]]:
        """The low dtypes to try, lowest first (`asked`: mode.candidates, else the job's dtype); one the backend cannot
        run is left out with its reason; fp32 and fp64 are no candidates (fp32 is where failing parts stay)."""
        high = [d for d in asked if DTYPE_NAMES.index(d) >= DTYPE_NAMES.index(HIGH)]
        if high:
            valid = [d for d in DTYPE_NAMES if DTYPE_NAMES.index(d) < DTYPE_NAMES.index(HIGH)]
            raise UserError(f"mode.candidates: {high[0]} is no low dtype (parts that fail stay in {HIGH}); valid: {', '.join(valid)}")
        kept, notes = [], []
        for dtype in asked:
            try:
                judge.runner(uniform(parts, dtype))
                kept.append(dtype)
            except Unsupported as exc:
                notes.append(f"candidate {dtype} left out: {exc}")
        if not kept:
            raise Unsupported("; ".join(notes))
        return kept, notes

    def _points(self, ctx: Context, judge: Judge, plan: dict[str, str], candidates: list[str],
                flops: dict[str, int]) -> tuple[list[dict], str]:
        """The plan and the uniform points beside it (each candidate, fp32): verdict, errors, p50, the share of FLOPs
        in low dtypes; the cheapest passing one is `chosen`, by latency where it can be trusted (an accelerator, or a
        CPU whose timings are not noisy), else by that FLOPs share. Returns the points and what decided."""
        total, points, modules = sum(flops.values()), [], Policy(ctx.weights).parts()
        for label, parts in {"plan": plan, **{f"all {d}": uniform(modules, d) for d in (*candidates, HIGH)}}.items():
            if label != "plan" and parts == plan:
                points[0]["point"] = f"plan (= {label})"
                continue
            c, runner, feeds = judge(parts), judge.runner(parts), batch_of(judge.feeds, ctx.batch_size)
            t = timing.quick(lambda: runner.infer(feeds), runner.target.device, ctx.batch_size, ctx.threads).stats()
            points.append({"point": label, "parts": parts, "passed": c.passed, **figures(c), "p50_us": t["p50_us"],
                           "noisy": bool(t["noisy"]), "chosen": False,
                           "low_flops_share": sum(flops[p] for p, d in parts.items() if d != HIGH) / total,
                           "lowest_share": sum(flops[p] for p, d in parts.items() if d == candidates[0]) / total})
        passing = [p for p in points if p["passed"]]
        if ctx.target().kind != "cpu" or not any(p["noisy"] for p in points):
            chosen = min(passing, key=lambda p: p["p50_us"])
            decided = f"latency: the lowest p50 of the passing points on {ctx.device} (timings not noisy)"
        else:
            chosen = max(passing, key=lambda p: (p["low_flops_share"], p["lowest_share"]))
            decided = (f"the share of FLOPs in low dtypes: {ctx.device}'s timings here are noisy (IQR/median > "
                       f"{timing.NOISY_IQR}), so latency cannot decide")
        chosen["chosen"] = True
        return points, decided

    def _report(self, ctx: Context, result: Result, name: str, chosen: dict, held_out: verify.Comparison,
                points: list[dict], decided: str, split_words: str, evaluations: int, notes: list[str],
                ranking: dict[str, dict], flops: dict[str, int]) -> None:
        """The plan file(s), the command, the tables, the headline figures; overfit (held-out failed) fails the job."""
        parts = chosen["parts"]
        kept = [p for p, d in parts.items() if d == HIGH]
        text = plan_yaml(ctx, name, parts, f"found by mode=search ({split_words}; {evaluations} evaluations; decided "
                                           f"by {decided.split(':')[0]})")
        path = ctx.workdir / "plan" / f"{name}.yaml"
        atomic_write_text(path, text)
        result.files.append(str(path))
        overfit = not held_out.passed
        saved = bool(self.mode.save_as) and not overfit
        if saved:
            atomic_write_text(CONF_PLANS / f"{name}.yaml", text, overwrite=False)
        cmd = command(ctx, name, parts, saved)
        share = chosen["low_flops_share"]
        result.metrics.update({"search/evaluations": float(evaluations), "search/kept_fp32": float(len(kept)),
                               "search/low_flops_share": share, "search/held_out_passed": float(held_out.passed),
                               "search/plan_p50_us": chosen["p50_us"], "search/parts": float(len(parts))})
        result.tables["parts"] = [{"part": p, **ranking.get(p, {}), "dtype": parts[p], "flops_per_row": flops[p]}
                                  for p in parts]
        result.tables["points"] = [{k: v for k, v in p.items() if k != "parts"} for p in points]
        result.details.update({"plan": {"name": name, "parts": parts}, "command": cmd, "decided_by": decided,
                               "splits": split_words, "notes": notes, "held_out_failures": held_out.failures,
                               "saved_as": str(CONF_PLANS / f"{name}.yaml") if saved else None})
        result.headline = (f"plan {name}: {', '.join(f'{p} {d}' for p, d in parts.items())}; {len(kept)} of {len(parts)} "
                           f"part(s) in {HIGH}, {share:.0%} of FLOPs low; {evaluations} evaluations; held-out "
                           + ("passed" if not overfit else "FAILED (overfit)"))
        result.summary = [result.headline, f"splits: {split_words}", f"decided by {decided}", *notes,
                          *table_lines(result.tables["parts"], points), f"plan file: {path}"
                          + (f" and {CONF_PLANS / f'{name}.yaml'}" if saved else ""),
                          f"{'overfit, not recommended' if overfit else 'use it'}: {cmd}"]
        if overfit:
            result.fail(f"overfit: plan {name} passes the search split and fails the held-out one "
                        f"({'; '.join(held_out.failures)}): not recommended")


def plan_yaml(ctx: Context, name: str, parts: dict[str, str], how: str) -> str:
    """conf/plan/<name>.yaml's text: the plan, for this policy's shape only."""
    return (f"# A precision plan {how}.\n# On {ctx.device}, backend {ctx.backend}, batch {ctx.batch_size}; "
            f"docs/precision-plans.md. Parts left out take the point's dtype; the normalizers stay fp32.\n"
            f"name: {name}\npolicy: {json.dumps(ctx.policy_shape)}   # the policy shape it was found for\n"
            f"limits: null        # judged by its lowest dtype's verify.limits row\n"
            f"parts: {{{', '.join(f'{p}: {d}' for p, d in parts.items())}}}\n")


def command(ctx: Context, name: str, parts: dict[str, str], saved: bool) -> str:
    """The command that runs the plan (mode=precision) on the same device, backend, batch, model and observations."""
    uniform = len(set(parts.values())) == 1
    args = ["python", "run.py", "mode=precision", f"device={ctx.device}",
            f"dtype={next(iter(parts.values())) if uniform else ctx.dtype}", f"backend={ctx.backend}",
            f"batch_size={ctx.batch_size}"]
    args += [f"precision_mode={ctx.precision_mode}"] * (ctx.precision_mode != "ieee")
    m, o = ctx.model_spec, ctx.obs
    args += [f"model.{k}={getattr(m, k)}" for k in ("checkpoint", "onnx", "results_dir", "hub_repo", "behavior", "step")
             if getattr(m, k) is not None]
    args += [f"obs={o.source}", *([f"obs.path={o.path}"] if o.source == "file" else
                                  [f"obs.rows={o.rows}", f"obs.scale={o.scale}", f"seed={ctx.seed}"])]
    if not uniform:
        args += [f"plan={name}"] + ([] if saved else [f"hydra.searchpath=[file://{ctx.workdir.resolve()}]"])
    return shlex.join(args)


def table_lines(parts: list[dict], points: list[dict]) -> list[str]:
    """The parts (sensitivity, chosen dtype, FLOPs) and the points (verdict, errors, p50) as aligned text."""
    def num(row: dict, key: str) -> str:
        return f"{row[key]:.3g}" if key in row else "-"

    lines = [f"{'part':<10} {'sensitivity':>11} {'KL':>9} {'|Δμ|/σ':>9} {'max_abs':>9} {'dtype':>6} {'FLOPs/row':>10}"]
    lines += [f"{r['part']:<10} {num(r, 'sensitivity'):>11} {num(r, 'kl_max'):>9} {num(r, 'mean_shift_sigma_max'):>9} "
              f"{num(r, 'max_abs'):>9} {r['dtype']:>6} {r['flops_per_row']:>10,}" for r in parts]
    lines += [f"{'point':<22} {'verdict':>7} {'KL':>9} {'|Δμ|/σ':>9} {'max_abs':>9} {'p50 µs':>9} {'low FLOPs':>9}"]
    lines += [f"{p['point']:<22} {'pass' if p['passed'] else 'FAIL':>7} {num(p, 'kl_max'):>9} "
              f"{num(p, 'mean_shift_sigma_max'):>9} {num(p, 'max_abs'):>9} {p['p50_us']:>9,.1f}"
              f"{'~' if p['noisy'] else ' '}{p['low_flops_share']:>8.0%}" + ("  <- chosen" if p["chosen"] else "")
              for p in points]
    return lines
