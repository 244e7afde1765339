"""Answers that agree with themselves: one fingerprint wherever one is shown, and summaries that agree with their own
tables (property tests over random sweep tables)."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser

from huggy_exp import bundle
from huggy_exp.compare import load_outputs
from huggy_exp.verify import fingerprint

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
