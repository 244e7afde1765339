"""Answers that agree with themselves: one fingerprint wherever one is shown, and summaries that agree with their own
tables (property tests over random sweep tables)."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from huggy_exp import bundle, report, tracking
from huggy_exp.compare import (
    comparison_lines,
    load_outputs,
    negative_control,
    port_lines,
    recommend,
)
from huggy_exp.config import modes
from huggy_exp.verify import fingerprint

VERIFIED_MODES = tuple(name for name, mode in modes().items() if mode.verified)  # the modes' own trait

HEX = re.compile(r"^[0-9a-f]{12,64}$")


class Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts (the header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data) -> None:
        if self.cell is not None:
            self.cell.append(data)


def column(rows: list[list[str]], name: str, key: str = "job") -> dict[str, str]:
    """{row's `key` cell: its `name` cell} of a table whose first row is the header (empty cells left out)."""
    head = rows[0]
    if name not in head:
        return {}
    return {r[head.index(key)]: r[head.index(name)] for r in rows[1:] if r[head.index(name)]}


def markdown_tables(text: str) -> list[list[list[str]]]:
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if not all(set(c) <= {"-", " "} for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_one_sweep_shows_one_fingerprint_per_point_everywhere(tmp_path):
    """Terminal, result.json, summary.json/csv/md, report.html (verdicts and the reference table), comparison.csv, the
    MLflow tags and the bundle manifest: every fingerprint shown for a point is (a prefix of) the one the job computed,
    which is verify.fingerprint of the outputs it wrote. Equal prefixes, identical outputs: action and record of one dtype
    on the same inputs show the same fingerprint; fp32 and bf16 show different ones."""
    import mlflow
    from test_trust import cli

    sweep, store = tmp_path / "sweep", f"sqlite:///{tmp_path}/mlflow.db"
    got = cli(["-m", "mode=action,record", "dtype=fp32,bf16", "obs.rows=4", "batch_size=4", f"tracking.uri={store}",
               f"hydra.sweep.dir={sweep}"], None)
    assert got.code == 0, got.err[-2000:]
    jobs = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/result.json")}
    assert len(jobs) == 4
    truth = {job: r["tags"]["fingerprint"] for job, r in jobs.items()}
    for job, r in jobs.items():  # the definition: the SHA-256 of the outputs' bytes the job wrote
        assert truth[job] == fingerprint(load_outputs({"status": r["status"], "dir": str(sweep / job)}))["fingerprint"]
        assert r["tags"]["quantized_fingerprint"] != truth[job]
    by = {(r["mode"], r["dtype"]): truth[job] for job, r in jobs.items()}
    assert by["action", "fp32"] == by["record", "fp32"] != by["action", "bf16"] == by["record", "bf16"]

    shown: list[tuple[str, str, str]] = []  # (where, job, value)
    current, summed = None, False
    for line in got.out.splitlines():  # every job's PASS line, then the sweep's line per point
        started = re.match(r"\[(\d+)/\d+\] ", line)
        current = str(int(started.group(1)) - 1) if started else current
        summed = summed or line.startswith("sweep summary")
        for value in re.findall(r"fingerprint ([0-9a-f]+)", line):
            shown.append(("terminal", line.split()[0] if summed else current, value))
    assert len([s for s in shown if s[0] == "terminal"]) == 8, got.out[-3000:]
    summary = json.loads((sweep / "summary.json").read_text())
    shown += [("summary.json", r["job"], r["fingerprint"]) for r in summary["rows"]]
    with open(sweep / "summary.csv") as fh:
        shown += [("summary.csv", r["job"], r["fingerprint"]) for r in csv.DictReader(fh)]
    with open(sweep / "comparison.csv") as fh:
        shown += [("comparison.csv", r["job"], r["fingerprint"]) for r in csv.DictReader(fh)]
    for table in markdown_tables((sweep / "summary.md").read_text()):
        shown += [("summary.md", job, v) for job, v in column(table, "fingerprint").items()]
    page = Tables()
    page.feed((sweep / "report.html").read_text())
    found = [(f"report.html table {i}", job, v) for i, t in enumerate(page.tables) for job, v in column(t, "fingerprint").items()]
    assert len({where for where, _, _ in found}) == 2, found  # the verdicts, and the reference point's table
    shown += found
    client = mlflow.MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id])
    run_ids = {r["tracking"]["run_id"]: job for job, r in jobs.items()}
    shown += [("mlflow", run_ids[run.info.run_id], run.data.tags["fingerprint"]) for run in runs if run.info.run_id in run_ids]
    for job, r in jobs.items():
        if r["mode"] == "record":
            manifest = bundle.read(r["details"]["bundle"]).manifest
            (point,) = manifest["points"].values()
            shown.append(("bundle manifest", job, point["fingerprints"]["fingerprint"]))
    places = {where for where, _, _ in shown}
    assert {"terminal", "summary.json", "summary.csv", "summary.md", "comparison.csv", "mlflow", "bundle manifest"} <= places
    for where, job, value in shown:
        assert HEX.match(value) and truth[job].startswith(value), (where, job, value, truth[job])
    assert {job for where, job, _ in shown if where == "mlflow"} == set(jobs)


# --- summaries that agree with their tables: random sweep tables (hypothesis)

DEVICES, DTYPES, BACKENDS, BATCHES = ("cpu", "cuda:0", "npu:0"), ("fp32", "fp16", "bf16"), ("eager", "onnxruntime"), (1, 64, 1024)
TABLES = settings(max_examples=150, deadline=None, derandomize=True, database=None)


@st.composite
def sweep_tables(draw) -> list[dict]:
    """Rows as sweep.summarize writes them: any mode, device, dtype, batch, verdict (a case's expectation met or not),
    latencies (a benchmark's ladder: several backends and batch sizes) or none, noisy or not, one or two models."""
    rows = []
    for job in range(draw(st.integers(1, 10))):
        mode = draw(st.sampled_from(("precision", "benchmark", "action", "record", "replay")))
        status = draw(st.sampled_from(("passed", "failed", "failed", "skipped", "error")))
        batch, expect = draw(st.sampled_from(BATCHES)), draw(st.sampled_from((None, None, "passed", "failed")))
        timed = status in ("passed", "failed") and draw(st.booleans())
        ladder = ([(b, n) for b in draw(st.lists(st.sampled_from(BACKENDS), min_size=1, max_size=2, unique=True))
                   for n in sorted({1, batch})] if mode == "benchmark" else [("eager", batch)]) if timed else []
        p50 = [draw(st.floats(1.0, 1e5, allow_nan=False)) for _ in ladder]
        model = draw(st.sampled_from(("m1", "m1", "m2")))
        rows.append({"job": str(job), "run_name": f"{mode}-{job}", "mode": mode, "device": draw(st.sampled_from(DEVICES)),
                     "dtype": draw(st.sampled_from(DTYPES)), "precision_mode": "ieee", "batch_size": batch,
                     "status": status, "expect": expect, "expectation_met": None if expect is None else status == expect,
                     "latency_points": [[b, n, v] for (b, n), v in zip(ladder, p50)],
                     "throughput_points": [[b, n, n * 1e6 / v] for (b, n), v in zip(ladder, p50)],
                     "noisy_points": [[b, n, float(draw(st.booleans()))] for b, n in ladder],
                     "metrics": {"p50_us": p50[-1]} if p50 else {}, "noisy": False, "model_sha256": model,
                     "model_name": f"{model}.pt", "max_abs_limit": 1e-5, "note": "", "verified": mode in VERIFIED_MODES})
    return rows


def comparable(rows: list[dict], device: str, model: str, batch: int) -> list[tuple[dict, str, float]]:
    """(row, backend, p50) of every judged latency at one device, model and batch size."""
    return [(r, b, p) for r in rows if r["mode"] in VERIFIED_MODES and r["status"] in ("passed", "failed")
            and r["device"] == device and r["model_name"] == model for b, n, p in r["latency_points"] if n == batch]


def eligible(group: list[tuple[dict, str, float]]) -> list[tuple[dict, str, float]]:
    """The passing latencies of a group whose dtype failed nowhere in it (a case's expected failure is no failure)."""
    failed = {r["dtype"] for r, _, _ in group if r["status"] == "failed" and not negative_control(r)}
    return [(r, b, p) for r, b, p in group if r["status"] == "passed" and r["dtype"] not in failed]


@given(sweep_tables())
@TABLES
def test_every_recommendation_is_the_fastest_passing_point_at_its_batch_backend_and_device(rows):
    recs = recommend(rows)
    for where, rec in recs.items():
        if not rec["dtype"]:
            continue
        model = next(r["model_name"] for r in rows if r["job"] == rec["job"])
        group = comparable(rows, rec["device"], model, rec["batch_size"])
        (picked,) = [(r, b, p) for r, b, p in group if r["job"] == rec["job"] and b == rec["backend"] and p == rec["p50_us"]]
        assert picked in eligible(group) and picked[0]["dtype"] == rec["dtype"], where  # a passing point, not a failing dtype
        assert rec["p50_us"] == min(p for _, _, p in eligible(group)), where  # the fastest of its like
        assert f"batch {rec['batch_size']}" in where and rec["dtype"] not in rec["failing"]


@given(sweep_tables())
@TABLES
def test_a_summary_never_says_none_when_its_table_holds_a_passing_timed_point(rows):
    recs = recommend(rows)
    picked = {(rec["device"], rec["batch_size"]) for rec in recs.values() if rec["dtype"]}
    for r in rows:
        for _, n, _ in r["latency_points"]:
            if any(t[0] is r for t in eligible(comparable(rows, r["device"], r["model_name"], n))):
                assert (r["device"], n) in picked, (r, recs)
    lines = [line for line in comparison_lines(rows, [], recs) if line.startswith("recommended")]
    for text in [*lines, tracking.recommendation({"recommended": recs})]:
        assert not re.search(r"\bnone\b", text) and "has a verdict and a latency" not in text, text
    assert "precision verdict" not in report.recommendation_section({"recommended": recs})
    if any(r["mode"] in VERIFIED_MODES and r["status"] in ("passed", "failed") for r in rows):
        assert recs  # every judged device gets a line: a pick, or why there is none
    else:
        assert not recs and not lines


@given(sweep_tables())
@TABLES
def test_an_expected_outcome_is_marked_met_or_not_in_words_and_colour(rows):
    for r in rows:
        cell = report.outcome(r)[1]
        if r["expect"] is None:
            assert f'class="{r["status"]}"' in cell and "expected" not in cell
        elif r["expectation_met"]:
            assert 'class="met"' in cell and ": met" in cell  # an expected failure is the answer asked for: not red
        else:
            assert 'class="missed"' in cell and "NOT met" in cell


def test_record_and_replay_sweeps_report_their_own_results_not_a_missing_recommendation():
    """A replay sweep: agreement with the recording, worst ULP, the dual benchmark's verdicts and ratios, the latency
    changes; a record sweep: its points per bundle. Neither has precision points, so neither gets a recommendation line."""
    def point(job, mode, metrics, port):
        return {"job": job, "mode": mode, "device": "cpu", "dtype": "fp32", "status": "passed", "metrics": metrics,
                "port": port, "latency_points": [["eager", 8, 200.0]], "model_sha256": "m", "model_name": "m"}

    replays = [point("0", "replay", {"bitwise": 1.0, "ulp_max": 0.0, "dual_ratio": 1.0, "lat_ratio": 1.08},
                     {"dual_benchmark": "pass", "latency_change": "not significant"}),
               point("1", "replay", {"bitwise": 0.5, "ulp_max": 3.0, "dual_ratio": 1.4, "lat_ratio": 1.3},
                     {"dual_benchmark": "warn", "latency_change": "slower"})]
    (line,) = port_lines(replays)
    assert line == ("replay: 2 point(s); bitwise equal to their recording: 1/2 (worst 3 ULP); dual benchmark: pass 1, "
                    "warn 1 (ratios 1..1.4); latency vs recording: not significant 1, slower 1 (ratios 1.08..1.3)")
    records = [point("0", "record", {"p50_us": 219.0, "max_abs_vs_fp64": 5.8e-7}, {"bundle": "cert", "point": "cpu/fp32/eager/b8"})]
    assert port_lines(records) == ["record into cert: 1 point(s): cpu/fp32/eager/b8 p50 219 µs, max_abs vs fp64 5.8e-07"]
    assert recommend(replays + records) == {}
    assert not [x for x in comparison_lines(replays + records, [], {}) if x.startswith("recommended")]
