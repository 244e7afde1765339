"""`replay`: a bundle's inputs run here at this point, held to what the bundle recorded (huggy_exp/certify.py's rules).
Described in docs/modes.md#replay and docs/port-certificate.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp import bundle, environment, plots
from huggy_exp.certify import bitwise, dual_benchmark, errors, latency_change, named_outputs, same_dtype_point, worst
from huggy_exp.config import DTYPE_NAMES, ReplayMode
from huggy_exp.context import Context
from huggy_exp.errors import UserError
from huggy_exp.report import escape
from huggy_exp.results import Result
from huggy_exp.files import atomic_write_text
from huggy_exp.runners import build, reference, run_feeds
from huggy_exp.tasks import Task
from huggy_exp.tasks.record import time_calls
from huggy_exp.verify import fingerprints, nonfinite_failures, within


class ReplayTask(Task):
    mode: ReplayMode

    def run(self, ctx: Context) -> Result:
        m = self.mode
        if not m.bundle:
            raise UserError("mode=replay needs mode.bundle=<folder written by mode=record>")
        b = bundle.read(m.bundle, bundle.weights_sha256(ctx.weights), m.allow_other_model)
        feeds, fp64 = b.inputs(), b.reference()
        key = bundle.point_key(ctx.device, ctx.dtype_label, ctx.backend, ctx.batch_size)
        # --- run here: outputs, latency, this host's own fp64 reference
        runner = build(ctx)
        here = named_outputs(run_feeds(runner, feeds))
        timed = time_calls(runner, ctx, feeds, m.latency)
        host64 = named_outputs(run_feeds(reference(ctx, "fp64"), feeds), np.float64)
        env_here = environment.capture()
        # --- the recorded points it is held to
        match = same_dtype_point(b.points, ctx.device, ctx.dtype_label, ctx.backend, ctx.batch_size)
        ref_key = self._reference_key(b, ctx, match)
        env_rows = environment.diff(b.points[match or ref_key or next(iter(b.points))]["environment"], env_here) if b.points else []
        result = Result(arrays=dict(here))
        report = Report(key, b, match, ref_key, result)
        self._finite(result, b, fp64, match, ref_key)
        self._agreement(result, report, b, ctx, here, match, timed.threads, env_rows)
        self._against_fp64(result, report, here, fp64, host64, ctx, judge=match is None and ref_key is None)
        self._dual(result, report, b, here, fp64, ref_key)
        self._latency(result, report, b, ctx, timed, match, ref_key)
        result.metrics["env/changed_fields"] = float(len(env_rows))
        result.tables["env_diff"] = env_rows
        # --- what the job says
        result.tags.update(fingerprints(here, m.decimals))
        result.summary = [report.headline(), *report.lines]
        result.headline = result.summary[0]
        result.details.update({"headline": result.summary[0], "bundle": str(b.root.resolve()), "point": key,
                               "recorded_point": match, "reference_point": ref_key,
                               "recorded_fingerprints": b.points[match]["fingerprints"] if match else None,
                               "threads": timed.threads, "environment_diff": env_rows, "notes": report.lines})
        result.files += report.write(ctx.workdir, timed.samples, ctx.plots)
        return result

    @staticmethod
    def _finite(result: Result, b: bundle.Bundle, fp64: dict, match: str | None, ref_key: str | None) -> None:
        """A NaN/inf in what this replay is held to (the recording, the reference point, the fp64 reference) fails it."""
        for recorded in dict.fromkeys(filter(None, (match, ref_key))):
            for why in nonfinite_failures(b.outputs(recorded), f"the recording {recorded}"):
                result.fail(why)
        for why in nonfinite_failures(fp64, "the bundle's fp64 reference"):
            result.fail(why)

    def _reference_key(self, b: bundle.Bundle, ctx: Context, match: str | None) -> str | None:
        """mode.reference_point: a recorded key, a dtype (its recorded point), or null (the same-dtype point)."""
        spec = self.mode.reference_point
        if spec is None:
            return match
        if spec in b.points:
            return spec
        recorded = ", ".join(b.points) or "none"
        if spec in DTYPE_NAMES:
            found = same_dtype_point(b.points, ctx.device, spec, ctx.backend, ctx.batch_size)
            if found is None:
                raise UserError(f"mode.reference_point={spec}: the bundle has no {spec} point; recorded: {recorded}")
            return found
        raise UserError(f"mode.reference_point={spec!r} is not a recorded point or a dtype; recorded: {recorded}")

    def _agreement(self, result: Result, report: "Report", b: bundle.Bundle, ctx: Context, here: dict, match: str | None,
                   threads: int, env_rows: list[dict]) -> None:
        """Bitwise share, ULP distance and max |Δ| against the recorded point of the same dtype."""
        if match is None:
            report.lines.append(f"no recording of {ctx.dtype} in the bundle (recorded: {', '.join(b.points)}): "
                                "compared against the bundle's fp64 reference only")
            result.details["no_recording"] = True
            return
        recorded, limit = b.outputs(match), ctx.atol()
        same_point = (match == report.key and int(b.points[match].get("threads", 1)) == threads
                      and environment.same_stack(env_rows))
        required = self.mode.require_bitwise or same_point
        rows = []
        for name in here:
            if name not in recorded:
                report.lines.append(f"{name}: not in the recording of {match}")
                continue
            row = {"output": name, **bitwise(here[name], recorded[name]), **errors(here[name], recorded[name], ctx.judged_dtype)}
            rows.append(row)
            result.metrics.update({f"{name}/vs_recorded/{k}": float(v) for k, v in row.items() if k != "output"})
            if required and row["bitwise_share"] < 1.0:
                why = "same device, dtype, backend, batch and threads on an unchanged host stack" if same_point else "mode.require_bitwise=true"
                result.fail(f"{name} is not bitwise identical to the recording {match} ({row['bitwise_share']:.2%} equal, "
                            f"max {row['ulp_max']:.0f} ULP; {why})")
            if "max_abs" in row and not within(row["max_abs"], limit):
                result.fail(f"{name} max |replay - recorded {match}| {row['max_abs']:.3g} > tolerance {limit:g} ({ctx.judged_dtype})")
        if rows:
            result.metrics["agreement/bitwise_share"] = min(r["bitwise_share"] for r in rows)
            result.metrics["agreement/ulp_max"] = max(r["ulp_max"] for r in rows)
        result.tables["agreement"] = rows
        report.bitwise_required = required

    def _against_fp64(self, result: Result, report: "Report", here: dict, fp64: dict, host64: dict, ctx: Context,
                      judge: bool) -> None:
        """Every output against the bundle's fp64 reference; this host's fp64 against the bundle's (how far fp64 moved)."""
        dtype, limit = ctx.judged_dtype, ctx.atol()
        for name in here:
            if name not in fp64:
                continue
            m = errors(here[name], fp64[name], dtype)
            result.metrics.update({f"{name}/vs_fp64/{k}": v for k, v in m.items()})
            drift = errors(host64[name], fp64[name])
            result.metrics.update({f"{name}/fp64_here_vs_bundle/{k}": v for k, v in drift.items() if k in ("max_abs", "mismatch_share")})
            if judge and "max_abs" in m and not within(m["max_abs"], limit):
                result.fail(f"{name} max_abs vs the bundle's fp64 {m['max_abs']:.3g} > tolerance {limit:g} ({dtype})")
            report.fp64.append({"output": name, **m, "fp64_here_vs_bundle_max_abs": drift.get("max_abs", drift.get("mismatch_share"))})

    def _dual(self, result: Result, report: "Report", b: bundle.Bundle, here: dict, fp64: dict, ref_key: str | None) -> None:
        if ref_key is None:
            return
        rows = dual_benchmark(here, b.outputs(ref_key), fp64)
        for r in rows:
            result.metrics[f"dual/{r['output']}/{r['metric']}_ratio"] = r["ratio"]
        verdict = worst(r["verdict"] for r in rows)
        if rows:
            result.metrics["dual/worst_ratio"] = max(r["ratio"] for r in rows)
        result.tags["dual_benchmark"] = verdict
        result.tables["dual_benchmark"] = rows
        bad = [r for r in rows if r["verdict"] == "fail"]
        if bad:
            result.fail("dual benchmark fails: " + "; ".join(
                f"{r['output']} {r['metric']} ratio {r['ratio']:.3g} > {r['warn_up_to']:g} (vs {ref_key})" for r in bad))

    def _latency(self, result: Result, report: "Report", b: bundle.Bundle, ctx: Context, timed, match: str | None,
                 ref_key: str | None) -> None:
        stats = timed.stats()
        result.metrics.update({f"latency/{k}": float(stats[k]) for k in ("p50_us", "p90_us", "p99_us", "samples", "noisy")})
        result.latency = {k: float(stats[k]) for k in ("p50_us", "p99_us", "obs_per_s", "noisy", "samples", "threads")}
        against = next((k for k in (match, ref_key) if k and b.points[k]["batch"] == ctx.batch_size), None)
        if against is None:
            report.lines.append(f"latency not compared: no recorded point at batch {ctx.batch_size} of this dtype or the reference")
            return
        report.recorded_latency = b.latency(against)
        change = {**latency_change(report.recorded_latency, timed.samples, self.mode.alpha), "against": against}
        result.metrics.update({f"latency_change/{k}": float(v) for k, v in change.items() if isinstance(v, (int, float))})
        result.tags["latency_change"] = change["verdict"]
        result.details["latency_change"] = change
        if self.mode.fail_on_latency and change["verdict"] == "slower":
            result.fail(f"latency {change['median_ratio']:.2f}x the recording's median (p = {change['p_value']:.2g}, "
                        f"tolerance {change['tolerance']:.0%}; mode.fail_on_latency=true)")


class Report:
    """The replay's markdown report and plots, read from its Result (tables agreement, dual_benchmark, env_diff, the
    latency change, the fingerprint) and what the Result does not hold: notes, the fp64 rows, the recorded latency."""

    def __init__(self, key: str, b: bundle.Bundle, match: str | None, ref_key: str | None, result: Result):
        self.key, self.bundle, self.match, self.ref_key, self.result = key, b, match, ref_key, result
        self.lines, self.fp64, self.bitwise_required, self.recorded_latency = [], [], False, None

    def headline(self) -> str:
        r, parts = self.result, [f"replay {self.key}"]
        agreement, lat = r.tables.get("agreement"), r.details.get("latency_change") or {}
        if agreement:
            share = min(a["bitwise_share"] for a in agreement)
            parts.append("bitwise identical to " + self.match if share == 1.0 else
                         f"{share:.1%} bitwise equal to {self.match} (max {max(a['ulp_max'] for a in agreement):.0f} ULP)")
        else:
            parts.append("no recording of this dtype: vs fp64 only")
        if r.tags.get("dual_benchmark"):
            worst_ratio = max(d["ratio"] for d in r.tables["dual_benchmark"])
            parts.append(f"dual benchmark {r.tags['dual_benchmark']} (worst ratio {worst_ratio:.3g} vs {self.ref_key})")
        if "median_ratio" in lat:
            parts.append(f"latency {lat['verdict']} ({lat['median_ratio']:.2f}x median, p = {lat['p_value']:.2g})")
        parts.append(f"{len(r.tables['env_diff'])} environment field(s) differ")
        return "; ".join(parts) + (f"; fingerprint {r.tags['fingerprint'][:12]}" if r.tags.get("fingerprint") else "")

    def write(self, workdir: Path, samples, plot: bool) -> list[str]:
        """replay.md, and with `plot` the latency CDF (recorded against here)."""
        files, r = [], self.result
        lat, env, dual = r.details.get("latency_change") or {}, r.tables["env_diff"], r.tables.get("dual_benchmark")
        agreement = r.tables.get("agreement")
        cdf = plot and self.recorded_latency is not None
        if cdf:
            files.append(plots.distributions(workdir / "latency_cdf.png", {f"recorded {lat['against']}": np.asarray(self.recorded_latency) * 1e6,
                                                                            f"here {self.key}": np.asarray(samples) * 1e6},
                                             "latency per call (µs)", f"latency, replay {self.key}"))
        md = [f"# Replay of {escape(self.bundle.root.name)}: {escape(self.key)}", "", escape(self.headline()), ""]
        md += [f"- {escape(line)}" for line in self.lines]
        if agreement:
            md += ["", f"## Agreement with the recording {escape(self.match)}" + (" (bitwise required)" if self.bitwise_required else ""), "",
                   *_table(agreement, ["output", "bitwise_share", "ulp_max", "ulp_mean", "ulp_over_1_share", "max_abs", "mismatch_share"])]
        md += ["", "## Against the bundle's CPU fp64 reference", "",
               *_table(self.fp64, ["output", "max_abs", "rmse", "max_rel", "cosine", "mismatch_share", "fp64_here_vs_bundle_max_abs"])]
        if dual:
            md += ["", f"## Dual benchmark (msprobe): error here / error of {escape(self.ref_key)}, both vs fp64", "",
                   *_table(dual, ["output", "metric", "error", "reference_error", "ratio", "verdict", "pass_up_to", "warn_up_to"])]
        if "median_ratio" in lat:
            md += ["", f"## Latency against {escape(lat['against'])}", "",
                   f"median {lat['recorded_median_us']:,.1f} µs recorded, {lat['here_median_us']:,.1f} µs here: {lat['median_ratio']:.3f}x "
                   f"(95% CI {lat['ci95_low']:.3f}..{lat['ci95_high']:.3f}), p90 {lat['p90_ratio']:.3f}x, p = {lat['p_value']:.3g}: "
                   f"**{lat['verdict']}** ({lat['test']})"] + (["", "![latency](latency_cdf.png)"] if cdf else [])
        md += ["", "## Environment diff", ""]
        md += _table(env, ["field", "recorded", "here"]) if env else ["none: same host stack"]
        atomic_write_text(workdir / "report.md", "\n".join(md) + "\n")
        return ["report.md", *files]


def _table(rows: list[dict], columns: list[str]) -> list[str]:
    cols = [c for c in columns if any(c in r for r in rows)]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else ("" if v is None else escape(v))  # noqa: E731
    return ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols), *("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows)]
