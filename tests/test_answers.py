"""Answers that agree with themselves: one fingerprint wherever one is shown, and summaries that agree with their own
tables (property tests over random sweep tables)."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st

from huggy_exp import bundle, headline, report, sweep, tracking
from huggy_exp.compare import (
    comparison_lines,
    pick_text,
    load_outputs,
    negative_control,
    port_lines,
    recommend,
)
from huggy_exp.config import DTYPE_NAMES, modes, ran_dtype
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


def ran(row: dict, backend: str) -> str:
    """The dtype a figure really ran (onnxruntime: the fp32 graph in an fp16 or bf16 job)."""
    return ran_dtype(backend, row["dtype"])


def eligible(group: list[tuple[dict, str, float]]) -> list[tuple[dict, str, float]]:
    """The passing latencies of a group whose dtype that ran failed nowhere in it (a case's expected failure is no
    failure): a figure of its point's dtype when that point passed, one of another dtype when a point of it passed."""
    failed = {r["dtype"] for r, _, _ in group if r["status"] == "failed" and not negative_control(r)}
    passed = {r["dtype"] for r, _, _ in group if r["status"] == "passed"}
    return [(r, b, p) for r, b, p in group if ran(r, b) not in failed
            and (r["status"] == "passed" if ran(r, b) == r["dtype"] else ran(r, b) in passed)]


@given(sweep_tables())
@TABLES
def test_every_recommendation_is_the_fastest_passing_point_at_its_batch_backend_and_device(rows):
    recs = recommend(rows)
    for where, rec in recs.items():
        if not rec["dtype"]:
            continue
        model = next(r["model_name"] for r in rows if r["job"] == rec["job"])
        group = comparable(rows, rec["device"], model, rec["batch_size"])
        picked = [(r, b, p) for r, b, p in eligible(group)
                  if r["job"] == rec["job"] and b == rec["backend"] and p == rec["p50_us"]]
        assert picked and ran(*picked[0][:2]) == rec["dtype"], where  # a passing figure of the dtype that ran it
        fastest = min(p for _, _, p in eligible(group))
        assert rec["p50_us"] == fastest, where  # the fastest of its like (no IQR here: a tie is an equal figure)
        tied = {ran(r, b) for r, b, p in eligible(group) if p == fastest}
        assert DTYPE_NAMES.index(rec["dtype"]) == max(map(DTYPE_NAMES.index, tied)), where  # of a tie, the more precise
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


# --- a figure carries the dtype that really ran it (issue 35, row 1)

def _bench(job: str, dtype: str, batch: int, figures: dict, status: str = "passed", error: float = 1e-6, iqr: float = 0.0,
           noisy: tuple = ()) -> dict:
    """A benchmark point as sweep.summarize writes it: {backend: p50} at one batch size, each with its IQR."""
    return {"job": job, "run_name": f"benchmark-cpu-{dtype}-b{batch}", "mode": "benchmark", "device": "cpu", "dtype": dtype,
            "precision_mode": "ieee", "batch_size": batch, "status": status, "expect": None, "expectation_met": None,
            "latency_points": [[b, batch, p] for b, p in figures.items()],
            "iqr_points": [[b, batch, iqr] for b in figures], "noisy_points": [[b, batch, float(b in noisy)] for b in figures],
            "throughput_points": [[b, batch, batch * 1e6 / p] for b, p in figures.items()],
            "metrics": {"max_abs_vs_fp64": error}, "noisy": "eager" in noisy, "model_sha256": "m", "model_name": "m.pt",
            "max_abs_limit": 0.05, "note": "", "verified": True}


def test_a_bf16_jobs_onnxruntime_figure_is_the_fp32_graphs_and_never_a_bf16_pick():
    """The issue's sweep at batch 1: onnxruntime in the bf16 job runs the fp32 graph; the pick names fp32, with fp32's
    error, and calls the two onnxruntime rows one fp32 graph."""
    rows = [_bench("0", "fp32", 1, {"eager": 150.0, "onnxruntime": 76.2}, error=1.2e-7),
            _bench("1", "bf16", 1, {"eager": 187.0, "onnxruntime": 76.1}, error=0.0043)]
    rec = recommend(rows)["cpu at batch 1"]
    assert (rec["dtype"], rec["backend"]) == ("fp32", "onnxruntime") and rec["jobs"] == ["1", "0"]
    assert "one fp32 graph, timed in jobs 1 (bf16) 76.1 µs, 0 (fp32) 76.2 µs" in rec["why"]
    assert "fp32 max_abs vs fp64 1.2e-07" in rec["why"] and "0.0043" not in rec["why"]
    assert [(o["dtype"], o["backend"]) for o in rec["options"]] == [("fp32", "onnxruntime"), ("fp32", "eager"), ("bf16", "eager")]
    for text in (pick_text(rec), tracking.recommendation({"recommended": {"cpu at batch 1": rec}}),
                 report.recommendation_section({"recommended": {"cpu at batch 1": rec}})):
        assert "bf16 onnxruntime" not in text, text


def test_an_onnxruntime_figure_whose_fp32_graph_no_point_judged_is_not_picked():
    rows = [_bench("0", "bf16", 1, {"eager": 187.0, "onnxruntime": 76.1})]
    rec = recommend(rows)["cpu at batch 1"]
    assert (rec["dtype"], rec["backend"]) == ("bf16", "eager")
    assert {o["label"]: o["verdict"] for o in rec["options"]}["fp32 onnxruntime (in the bf16 job 0)"] == "not judged"


def test_two_figures_within_their_noise_are_a_tie_and_the_more_precise_choice_wins():
    rows = [_bench("0", "fp32", 64, {"eager": 100.0}, iqr=6.0), _bench("1", "bf16", 64, {"eager": 96.0}, iqr=4.0)]
    rec = recommend(rows)["cpu at batch 64"]
    assert rec["dtype"] == "fp32" and rec["tie"] == ["bf16 eager"]
    assert rec["why"].startswith("fastest passing within noise (a tie") and "tied with bf16 eager 96 µs" in rec["why"] and "also passing" not in rec["why"]
    rows[1]["iqr_points"][0][2] = 1.0  # 100 ± 3 against 96 ± 0.5: no longer a tie
    assert recommend(rows)["cpu at batch 64"]["dtype"] == "bf16"


def test_the_noisy_note_is_said_only_where_the_picked_figure_is_noisy():
    quiet_pick = [_bench("0", "fp32", 8, {"eager": 50.0}), _bench("1", "bf16", 8, {"eager": 90.0}, noisy=("eager",))]
    assert "NOTE" not in recommend(quiet_pick)["cpu at batch 8"]["why"]
    noisy_pick = [_bench("0", "fp32", 8, {"eager": 50.0}, noisy=("eager",))]
    assert "NOTE: the picked latency is noisy" in recommend(noisy_pick)["cpu at batch 8"]["why"]


def test_a_point_is_noisy_where_its_own_p50_is_and_nowhere_else():
    """One flag per figure (issue 35, row 4): a benchmark point whose own p50 is quiet while onnxruntime's b64 figure is
    noisy reads quiet in the terminal, summary, report and MLflow; the noisy figure is flagged on its own line."""
    record = {"mode": "benchmark", "status": "passed", "latency": {"p50_us": 150.0, "noisy": 0.0},
              "metrics": {"latency/p50_us": 150.0, "latency/noisy": 0.0, "eager/b64/noisy": 0.0, "onnxruntime/b64/noisy": 1.0},
              "headline_metrics": {"p50_us": 150.0}}
    assert tracking.verdict(record) == "passed"
    assert "noisy" not in sweep.point_figures(record)
    row = {"job": "0", "run_name": "b", "status": "passed", "expect": None, "metrics": {"p50_us": 150.0},
           "noisy": headline.noisy(record)}
    assert "noisy" not in str(report.verdict_rows([row])[0])
    record["latency"]["noisy"] = record["metrics"]["latency/noisy"] = 1.0
    row["noisy"] = headline.noisy(record)
    assert tracking.verdict(record) == "passed, noisy" and "(noisy)" in sweep.point_figures(record)
    assert "noisy" in str(report.verdict_rows([row])[0])


# --- one number format, and no empty or false section (issue 35, row 9)

def test_a_figure_reads_the_same_in_every_output():
    """1,448.8 µs is `1,449` in the report, summary.md, the recommendation and MLflow's headline (not 1.45e+03, 1,450)."""
    assert [report.fmt(v) for v in (1448.8, 1200.0, 1234.5, 70.71, 8.3e-7, 0.9999968)] == [
        "1,449", "1,200", "1,234", "70.7", "8.3e-07", "0.999997"]
    assert headline.readable("p50_us", 1448.8) == 1449.0 and report.fmt(headline.readable("p50_us", 1448.8)) == "1,449"
    rows = [_bench("0", "fp32", 64, {"eager": 1448.8})]
    rec = recommend(rows)["cpu at batch 64"]
    assert "p50 1,449 µs" in rec["why"] and "p50 1,449 µs" in tracking.recommendation({"recommended": {"x": rec}})


def test_a_sweep_of_reference_points_is_not_told_it_lacks_one_and_no_column_is_always_empty():
    rows = [{"job": str(i), "run_name": f"precision-cpu-fp32-b{b}", "device": "cpu", "dtype": "fp32", "status": "passed"}
            for i, b in enumerate((1, 64))]
    section = report.comparison_section(rows, {})
    assert "No point of this sweep has a CPU fp32 point" not in section and "are the reference" in section
    rows.append({"job": "2", "run_name": "precision-cpu-bf16-b64", "device": "cpu", "dtype": "bf16", "status": "passed",
                 "vs_cpu_fp32_max_abs": 0.01})
    (table,) = (t for t in _tables(report.comparison_section(rows, {})))
    assert table[0] == ["job", "run", "max |Δaction| vs cpu fp32", "fingerprint"]  # a continuous policy: no discrete column


def _tables(page: str) -> list[list[list[str]]]:
    parser = Tables()
    parser.feed(page)
    return parser.tables


def test_a_latency_plot_without_throughput_has_no_empty_throughput_panel(tmp_path):
    """record and replay points time a latency, not a throughput: one panel, not an empty second one."""
    from PIL import Image

    from huggy_exp import plots

    only_latency = plots.versus_batch(tmp_path / "a.png", {"cpu fp32 eager": {"p50_us": [(8, 200.0)], "obs_per_s": []}}, "t")
    both = plots.versus_batch(tmp_path / "b.png", {"cpu fp32 eager": {"p50_us": [(8, 200.0)], "obs_per_s": [(8, 4e4)]}}, "t")
    (w1, h1), (w2, h2) = (Image.open(tmp_path / f).size for f in (only_latency, both))
    assert w1 / h1 < 1.6 < w2 / h2


# --- each mode's first screen answers its own question (issue 35, rows 3, 6, 10)

BENCHMARK_METRICS = {
    **{f"{b}/b8/{s}": v for b in ("eager", "onnxruntime") for s, v in (("p50_us", 200.0), ("obs_per_s", 4e4), ("noisy", 0.0))},
    **{f"loadgen/{s}/valid": float(s != "server") for s in ("single_stream", "multi_stream", "offline", "server")},
    **{f"loadgen/{s}/{k}": 10.0 for s in ("single_stream", "multi_stream", "server") for k in ("p90_us", "p99_us")},
    "loadgen/offline/samples_per_s": 5e4, "loadgen/server/max_qps": 212.4, "control_loop/rate_hz": 500.0,
    "control_loop/miss_rate": 0.979, "control_loop/miss_rate_upper": 0.99, "control_loop/max_rate_hz": 120.0,
    "latency/p50_us": 200.0, **{f"{o}/vs_fp64/{m}{x}": 1e-6 for o in ("actions", "memories")
                                 for m in ("max_abs", "cosine_min_row") for x in ("", "_limit")},
    "actions/vs_fp64/kl_max": 1e-9, "actions/vs_fp64/mean_shift_sigma_max": 1e-4}


def test_loadgens_answer_is_one_line_and_survives_the_metric_cap():
    """VALID/INVALID, the server's highest QPS and the deadline-miss rate: in the run's first line and among the 20
    metrics MLflow gets (the cap had cut the highest QPS and the loop's highest rate)."""
    from huggy_exp import loadgen

    said = loadgen.answer(BENCHMARK_METRICS)
    assert said == ("single_stream VALID; multi_stream VALID; offline VALID; server INVALID (highest QPS with p99 in "
                    "bound 212); control loop: miss rate 97.9% at 500 Hz (highest rate within the miss budget 120 Hz)")
    logged = headline.logged_metrics({"mode": "benchmark", "status": "passed", "batch_size": 8, "metrics": BENCHMARK_METRICS})
    assert len(logged) <= headline.MAX_LOGGED
    assert {"answer/server_valid", "answer/server_qps", "answer/miss_rate", "control_loop/max_rate_hz"} <= set(logged)
    assert list(logged)[:4] == ["answer/passed", "answer/server_valid", "answer/server_qps", "answer/miss_rate"]
    assert (logged["answer/server_valid"], logged["answer/server_qps"], logged["answer/miss_rate"]) == (0.0, 212, 0.979)
    assert "loadgen/server/max_qps" not in logged  # its answer, not logged twice


def test_a_replay_sweeps_runs_page_leads_with_did_the_port_hold():
    present = {f"metrics.`answer/{k}`" for k in ("bitwise", "ulp_max", "dual_ratio", "lat_ratio", "lat_p", "p50_us")}
    columns = tracking.view_columns(present | {"tags.`fingerprint`"})
    assert columns[:4] == ["tags.`verdict`", "metrics.`answer/bitwise`", "metrics.`answer/dual_ratio`",
                           "metrics.`answer/lat_ratio`"]
    precision = tracking.view_columns({"metrics.`answer/max_abs`", "params.`limit/max_abs`", "metrics.`answer/cosine`"})
    assert precision[:5] == ["tags.`verdict`", "metrics.`answer/max_abs`", "params.`limit/max_abs`",
                             "tags.`fingerprint`", "metrics.`answer/cosine`"]


def test_a_replay_sweeps_parent_states_what_it_found_in_its_verdict_and_first_line(tmp_path):
    import mlflow

    settings = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    tracking.start_sweep(settings, tmp_path / "sweep", "feed02", ["-m", "mode=replay", "threads=1,2"], 2)
    line = ("replay: 2 point(s); bitwise equal to their recording: 2/2 (worst 0 ULP); dual benchmark: pass 2 (ratios "
            "1..1); latency vs recording: within tolerance 2 (ratios 0.98..1.03)")
    summary = {"rows": [], "tally": {"passed": 2}, "line": "2/2 passed, 0 failed, 0 skipped, 0 error",
               "comparison": {"recommended": {}, "lines": ["device agreement fp32 (bundle b): all bit-identical", line],
                              "table": []}}
    tracking.end_sweep(settings, tmp_path / "sweep", summary, [])
    (parent,) = mlflow.MlflowClient(settings["uri"]).search_runs(["1"], "tags.sweep_id = 'feed02'")
    assert parent.data.tags["verdict"] == line
    assert parent.data.tags["mlflow.note.content"].split("\n")[0].endswith(f"**Found** {report.escape(line)}")


def test_a_jobs_report_names_its_headline_as_mlflow_does(tmp_path):
    record = {"run_name": "benchmark-cpu-fp32-b8", "status": "passed", "mode": "benchmark", "device": "cpu",
              "dtype": "fp32", "batch_size": 8, "metrics": BENCHMARK_METRICS,
              "headline_metrics": headline.headline_metrics("benchmark", BENCHMARK_METRICS, "passed", 8)}
    assert "ort_p50_us" in record["headline_metrics"]
    page = report.write_job_report(tmp_path, record, []).read_text()
    # a benchmark's error vs fp64 comes after its own answer, under what it is measured against (as in MLflow)
    assert "onnxruntime/p50_us" in page and "ort_p50_us" not in page and "vs_fp64/max_abs" in page


def test_obs_per_s_says_what_it_is_where_it_is_not_batch_over_p50():
    """Issue 35, row 10: b1 at p50 77.6 µs beside 5,010 obs/s (a tail of slow calls) read as a contradiction."""
    rows = [_bench("0", "fp32", 1, {"eager": 77.6})]
    rows[0]["throughput_points"] = [["eager", 1, 5010.0]]
    rec = recommend(rows)["cpu at batch 1"]
    assert report.OBS_PER_S in rec["why"] and report.OBS_PER_S in report.recommendation_section({"recommended": {"x": rec}})
    rows[0]["throughput_points"] = [["eager", 1, 1e6 / 77.6]]
    rec = recommend(rows)["cpu at batch 1"]
    assert report.OBS_PER_S not in rec["why"] and report.OBS_PER_S not in report.recommendation_section({"recommended": {"x": rec}})


def test_a_bf16_runs_fastest_backend_is_named_with_the_dtype_it_ran():
    metrics = {"eager/b8/p50_us": 200.0, "onnxruntime/b8/p50_us": 80.0, "eager/b8/obs_per_s": 4e4,
               "onnxruntime/b8/obs_per_s": 1e5}
    record = {"mode": "benchmark", "device": "cpu", "status": "passed", "batch_size": 8, "job_id": "j", "metrics": metrics}
    assert tracking.run_tags({**record, "dtype": "bf16"}, None)["best_backend"] == "onnxruntime (fp32)"
    assert tracking.run_tags({**record, "dtype": "fp32"}, None)["best_backend"] == "onnxruntime"
