"""Self-contained HTML reports: one per sweep (beside summary.md) and one per job (beside result.json).

A report is one file with its plots embedded as data URIs and no script, so it opens from the file system, from an
e-mail attachment and in MLflow's artifact viewer alike. It is written from the summary and result.json alone.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from huggy_exp.config import SWEEP_REFERENCE
from huggy_exp.headline import COSINE, ERROR, judged_limits, logged_metrics, logged_name, noisy
from huggy_exp.results import atomic_write_text, expectation
from huggy_exp.verify import FINGERPRINT

REPORT = "report.html"
# obs/s, defined once (timing.Timing.stats computes it): shown beside a figure whose obs/s is not batch / p50
OBS_PER_S = ("obs/s = rows per call / the mean call time (every timed call counted, the slow ones too), so it is below "
             "batch / p50 where a tail of slow calls lifts the mean above the median")


def obs_per_s_differs(batch: int, p50_us: float | None, obs_per_s: float | None) -> bool:
    """Whether a figure's obs/s is more than 10 % off batch / p50 (its definition then goes beside it)."""
    return bool(p50_us and obs_per_s) and abs(obs_per_s * p50_us / (batch * 1e6) - 1) > 0.1


OWN_ANSWERS = ("replay:", "record into", "loadgen job")  # compare.py's lines of sweeps that answer in their own terms
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#1f2328;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa}
td.num{text-align:right;font-family:ui-monospace,monospace}.passed,.met{color:#1a7f37;font-weight:600}
.failed,.error,.missed{color:#cf222e;font-weight:600}.skipped{color:#9a6700;font-weight:600}
.noisy{background:#fff8c5;color:#7d4e00;font-weight:600;padding:0 4px;border-radius:3px}
.tally{font-size:16px;margin:8px 0}.rec{background:#ddf4ff;border:1px solid #54aeff;border-radius:6px;padding:8px 12px}
img{max-width:100%;border:1px solid #d0d7de;margin:6px 0;display:block}code{font-family:ui-monospace,monospace}
.muted{color:#656d76}"""


def fmt(value) -> str:
    """A figure as every output prints it: 3 significant digits (cosines 6: they live next to 1), a figure of 100 and
    more as a whole number with thousands separators (1,449 µs, never 1.45e+03 beside 1,200), the rest as text."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, (int, float)):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if 100 <= abs(v) < 1e7 or v == int(v) and abs(v) < 1e7:
            return f"{round(v):,}"
        return f"{v:.6g}" if 0.999 <= v < 1 else f"{v:.3g}"
    return str(value)


MARKUP = str.maketrans({"|": "&#124;", "[": "&#91;", "]": "&#93;", "`": "&#96;", "\n": " ", "\r": " "})


def escape(value) -> str:
    """Text a user wrote (a name, a path, a reason) safe in HTML, markdown and a markdown table cell alike: HTML's and
    markdown's special characters as entities (rendered as the characters, never as markup), a line break a space."""
    return html.escape(str(value), quote=True).translate(MARKUP)


def _e(value) -> str:
    return escape(fmt(value))


def table(head: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    """An HTML table; cells are escaped text unless given as ("html", markup)."""
    def cell(i: int, v) -> str:
        if isinstance(v, tuple) and v and v[0] == "html":
            return f"<td>{v[1]}</td>"
        return f"<td class=num>{_e(v)}</td>" if i in numeric else f"<td>{_e(v)}</td>"

    out = ["<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(cell(i, v) for i, v in enumerate(r)) + "</tr>" for r in rows]
    return "\n".join(out) + "</table>"


def image(path: Path) -> str:
    """A PNG embedded as a data URI, captioned with its file name."""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{escape(path.name)}" src="data:image/png;base64,{data}"><figcaption class=muted>{escape(path.name)}</figcaption></figure>'


def _noisy(value) -> tuple[str, str]:
    return ("html", f"{_e(value)} <span class=noisy>noisy</span>")


def verdict(status: str) -> tuple[str, str]:
    return ("html", f'<span class="{escape(status)}">{escape(status.upper())}</span>')


def outcome(row: dict) -> tuple[str, str]:
    """A point's verdict; for a case with an expected verdict, whether it was met, in words and colour (green when met,
    an expected failure included: it is the answer the case asked for; red when not)."""
    if row.get("expect") is None:
        return verdict(row["status"])
    met = bool(row.get("expectation_met"))
    return ("html", f'<span class="{"met" if met else "missed"}">{escape(row["status"].upper() + expectation(row))}</span>')


def _write(folder: Path, title: str, sections: list[str], plots: list[Path], env: dict) -> Path:
    """`folder`/report.html: the sections, then the plots (embedded) and the environment."""
    if plots:
        sections.append("<h2>Plots</h2>" + "\n".join(image(p) for p in plots if p.is_file()))
    sections.append("<h2>Environment</h2>" + table(["package / host", "version"], [[k, v] for k, v in env.items()]))
    atomic_write_text(folder / REPORT, f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}"
                      f"</title><style>{STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n")
    return folder / REPORT


# --- a sweep


def verdict_rows(rows: list[dict]) -> list[list]:
    """One line per point: what it is, its verdict, the headline figures with the limit, the fingerprint, the note."""
    out = []
    for r in rows:
        m = r.get("metrics") or {}
        p50 = m.get("p50_us")
        p50_cell = _noisy(p50) if p50 is not None and r.get("noisy") else p50
        note = r.get("note", "") if r["status"] != "passed" or not r.get("verified", True) else ""  # record, replay: their answer
        out.append([r["job"], r["run_name"], outcome(r), m.get(ERROR), (r.get("limits") or {}).get("max_abs"),
                    m.get(COSINE), p50_cell, (r.get(FINGERPRINT) or "")[:12], note])
    return out


VERDICT_HEAD = ["job", "run", "verdict", "max abs error vs fp64", "limit", "cosine (worst row)", "p50 µs (own batch)",
                FINGERPRINT, "note"]


def recommendation_section(comparison: dict) -> str:
    """Per device and batch size the pick and every (dtype, backend) timed there, with its verdict and latency."""
    recs = comparison.get("recommended") or {}
    if not recs:
        return ("<h2>Recommendation</h2><p class=muted>No dtype is recommended: no point of this sweep was judged by "
                "its dtype's limits against CPU fp64 (record and replay points are judged against their bundle); what "
                "the points found is in their notes and the comparison below.</p>")
    parts = ["<h2>Recommendation</h2>"]
    for where, rec in recs.items():
        noisy = ' <span class=noisy>noisy p50: re-measure before relying on it</span>' if rec.get("noisy") else ""
        pick = " ".join(str(x) for x in (rec.get("dtype"), rec.get("backend")) if x) or "no pick"
        parts.append(f"<div class=rec><b>{escape(where)}: {escape(pick)}</b> &mdash; {escape(rec.get('why', ''))}{noisy}</div>")
        rows = [[o["label"], outcome({"status": "failed", "expect": "failed", "expectation_met": True})
                 if o["verdict"] == "expected failure" else verdict(o["verdict"]), o["p50_us"], o.get("obs_per_s"),
                 ", ".join(o.get("jobs") or [o["job"]])] for o in rec.get("options") or []]
        if rows:
            parts.append(table(["choice (the dtype that ran, backend)", "verdict", "p50 µs", "obs/s", "job"], rows, {2, 3}))
        if any(obs_per_s_differs(rec["batch_size"] or 0, o["p50_us"], o.get("obs_per_s")) for o in rec.get("options") or []):
            parts.append(f"<p class=muted>{escape(OBS_PER_S)}.</p>")
    return "\n".join(parts)


def comparison_section(rows: list[dict], comparison: dict) -> str:
    compared = [[r["job"], r["run_name"], r.get("vs_cpu_fp32_max_abs"), r.get("vs_cpu_fp32_discrete_agreement"),
                 (r.get(FINGERPRINT) or "")[:12]] for r in rows
                if "vs_cpu_fp32_max_abs" in r or "vs_cpu_fp32_discrete_agreement" in r]
    head = ["job", "run", "max |Δaction| vs cpu fp32", "discrete actions equal", FINGERPRINT]
    if not any(r[3] is not None for r in compared):  # a policy without discrete actions: no such column
        head, compared = head[:3] + head[4:], [r[:3] + r[4:] for r in compared]
    references = [r["run_name"] for r in rows
                  if r["device"] == "cpu" and r["dtype"] == SWEEP_REFERENCE and r["status"] != "error"]
    none = (f"<p class=muted>The CPU fp32 point(s) ({escape(', '.join(references))}) are the reference; no other point "
            "ran the same inputs (mode and its knobs, observations, seed, model, and batch size where the mode verifies "
            "per batch) to compare with them.</p>" if references else
            "<p class=muted>No point of this sweep has a CPU fp32 point on the same inputs to compare with.</p>")
    parts = ["<h2>Against the reference point (CPU fp32, same inputs)</h2>",
             table(head, compared, {2, 3}) if compared else none]
    own = ("agreement", "device agreement", "dual benchmark", *OWN_ANSWERS)
    if lines := [line for line in comparison.get("lines", []) if line.startswith(own)]:
        parts.append("<ul>" + "".join(f"<li><code>{escape(x)}</code></li>" for x in lines) + "</ul>")
    return "\n".join(parts)


def write_sweep_report(sweep_dir: Path, title: str, summary: dict, plots: list[Path], env: dict) -> Path:
    """report.html for a sweep: tally, verdicts with limits, reference comparison, recommendation, noise, plots."""
    rows = summary["rows"]
    noisy = [r for r in rows if r.get("noisy")]
    found = [line for line in (summary.get("comparison") or {}).get("lines", []) if line.startswith(OWN_ANSWERS)]
    sections = [f"<h1>{escape(title)}</h1>", f"<p class=tally>{escape(summary['line'])}</p>",
                *(f"<div class=rec><b>Found:</b> {escape(line)}</div>" for line in found),
                recommendation_section(summary.get("comparison") or {}),
                "<h2>Verdicts</h2>" + table(VERDICT_HEAD, verdict_rows(rows), {3, 4, 5, 6})]
    if noisy:
        sections.append(f"<p><span class=noisy>noisy</span> {len(noisy)} point(s) timed with IQR / median above 0.1 "
                        f"({escape(', '.join(r['run_name'] for r in noisy))}): their p50 is not a firm figure; re-measure "
                        "(mode=benchmark) before choosing on speed.</p>")
    sections.append(comparison_section(rows, summary.get("comparison") or {}))
    return _write(sweep_dir, title, sections, plots, env)


# --- one job


def write_job_report(workdir: Path, record: dict, plots: list[Path]) -> Path:
    """report.html for one job: verdict and reason, headline figures with limits, every metric, environment, plots."""
    title = f"{record['run_name']}: {record['status'].upper()}"
    metrics, model = record.get("metrics") or {}, record.get("model") or {}
    sections = [f"<h1>{escape(record['run_name'])}</h1>",
                f"<p class=tally>{verdict(record['status'])[1]} {escape(record.get('reason') or record.get('headline') or '')}</p>",
                f"<p class=muted>mode {escape(record['mode'])} · device {escape(record['device'])} · dtype "
                f"{escape(record['dtype'])} · batch {_e(record.get('batch_size'))} · model "
                f"{escape('embedded synthetic default (not real Huggy weights)' if model.get('synthetic') else str(model.get('path')))}</p>"]
    shown = logged_metrics(record)  # under the names MLflow shows them (`onnxruntime/p50_us`, not `ort_p50_us`)
    for p50 in (logged_name("p50_us", answer) for answer in (True, False)):  # the answer's, or after a mode's own
        if p50 in shown and noisy(record):
            shown[p50] = _noisy(shown[p50])
    for h2, kind, pairs in (("Headline (as MLflow logs it)", "metric", [[k, v] for k, v in shown.items()]),
                            ("Limits this verdict used", "limit", [[k, v] for k, v in judged_limits(record).items()]),
                            ("Every metric", "metric", [[k, v] for k, v in metrics.items() if k not in shown])):
        if pairs:
            sections.append(f"<h2>{h2}</h2>" + table([kind, "value"], pairs, {1}))
    return _write(workdir, title, sections, plots, record.get("environment") or {})
