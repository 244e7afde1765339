"""Open a sweep in the real MLflow UI (headless Chromium at 1600x1000 against `mlflow ui` on 127.0.0.1) and check what
a person sees without clicking or configuring anything.

    python scripts/ui_check.py [--store sqlite:///mlruns/mlflow.db] [--sweep <id>] [--port 5000 | --ui URL]
                               [--shots DIR] [--screenshot docs/ui_runs.png]

Each page (check_* below) opens in a browser profile that has never seen MLflow (so its Assistant panel opens, as on a
first visit); what each page must show: docs/ui-and-reports.md, "The browser check". Screenshots of every page go to
--shots (default: a temporary folder, printed). Exit 0 when everything holds, 1 naming what does not, 2 when it cannot
run (no Chromium: Debian `apt-get install chromium`; no such sweep or store).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from browser import Browser, BrowserError, find_browser  # noqa: E402

from huggy_exp import headline, tracking, ui  # noqa: E402
from huggy_exp.config import ran_dtype  # noqa: E402
from huggy_exp.errors import UserError  # noqa: E402

WIDTH, HEIGHT = 1600, 1000
LOAD_S = 90  # one page of the MLflow UI on a busy 2-core machine

# JavaScript helpers: is an element's box inside the viewport (and inside the clipping box `clip`), and is its left
# part really on top (not under a panel or another element)?
JS_SEEN = """
window.__inview = el => { const r = el.getBoundingClientRect();
  return r.width > 0 && r.left >= 0 && r.right <= innerWidth + 1 && r.top >= 0 && r.bottom <= innerHeight + 1; };
window.__textSeen = t => {  // is some element whose own text contains t on screen?
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) if (n.nodeValue.includes(t) && __seen(n.parentElement)) return true;
  return false;
};
window.__cut = (el, head) => {  // a text of it (or its first `head` characters) laid out past its right edge (an
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT), right = el.getBoundingClientRect().right + 1;
  const range = document.createRange();  // ellipsis, or clipped), not its other boxes (a resize handle)
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    range.selectNode(n);
    if (head !== undefined) range.setEnd(n, Math.min(head, n.length));
    const r = range.getBoundingClientRect();
    if (r.width > 0 && r.right > right) return true;
  }
  return false;
};
window.__seen = (el, clip) => {
  const r = el.getBoundingClientRect();
  const c = clip ? clip.getBoundingClientRect() : {left: 0, right: innerWidth, top: 0, bottom: innerHeight};
  const inside = r.width > 0 && r.left >= Math.max(0, c.left) - 1 && r.right <= Math.min(innerWidth, c.right) + 1
                 && r.top >= 0 && r.bottom <= innerHeight + 1;
  if (!inside) return false;
  const hit = document.elementFromPoint(Math.min(r.left + 8, r.right - 1), (r.top + r.bottom) / 2);
  return !!hit && (el === hit || el.contains(hit));
};
"""

JS_GRID = JS_SEEN + """
(() => {
  const clip = document.querySelector('.ag-center-cols-viewport') || document.querySelector('.ag-body-viewport');
  const headers = {};
  for (const h of document.querySelectorAll('.ag-header-cell[col-id]')) {
    const r = h.getBoundingClientRect();
    headers[h.getAttribute('col-id')] = {left: Math.round(r.left), right: Math.round(r.right), seen: __seen(h, h.closest('.ag-pinned-left-header') ? null : clip), cut: __cut(h)};
  }
  const rows = {};
  for (const row of document.querySelectorAll('.ag-row[row-index]')) {
    const i = row.getAttribute('row-index');
    rows[i] = rows[i] || {};
    for (const cell of row.querySelectorAll('.ag-cell[col-id]')) {
      const pinned = !!cell.closest('.ag-pinned-left-cols-container');
      const text = cell.innerText.trim(), head = text.indexOf(': ');  // a verdict's words before its reason
      rows[i][cell.getAttribute('col-id')] = {text, seen: __seen(cell, pinned ? null : clip), cut: __cut(cell),
                                              headCut: __cut(cell, head < 0 ? text.length : head)};
    }
  }
  const groups = [...document.querySelectorAll('.ag-header-group-cell')].filter(g => __seen(g, clip) && __cut(g.querySelector('.ag-header-group-text') || g));
  return {headers, rows: Object.values(rows), cutGroups: groups.map(g => g.innerText.trim())};
})()
"""

# the text a reader meets scrolling every scrolling box top to bottom (MLflow's compare tables render only the rows in view)
JS_SCROLLED_TEXT = """(async () => {
  const seen = [document.body.innerText];
  for (const box of [...document.querySelectorAll('*')].filter(e => e.scrollHeight > e.clientHeight + 20)) {
    for (let y = 0; y <= box.scrollHeight; y += Math.max(100, box.clientHeight - 40)) {
      box.scrollTop = y; await new Promise(r => setTimeout(r, 150)); seen.push(box.innerText);
    }
  }
  return seen.join('\\n');
})()"""

JS_IMAGES = "[...document.images].map(i => [i.alt, i.currentSrc.slice(0, 60), i.complete, i.naturalWidth])"


class Check:
    """One browser profile per page (a first visit every time), screenshots into `shots`, findings into `missing`."""

    def __init__(self, chrome: str, base: str, shots: Path, tmp: Path, screenshot: Path | None = None):
        self.chrome, self.base, self.shots, self.tmp, self.screenshot = chrome, base, shots, tmp, screenshot
        self.missing: list[str] = []
        self.pages = 0

    def visit(self, name: str, path: str, ready: str, timeout_s: float = LOAD_S):
        """A fresh browser on `path`; waits until the JavaScript `ready` is truthy, then screenshots. Returns it open."""
        self.pages += 1
        url = path if path.startswith(("http://", "https://", "file://")) else f"{self.base}/{path}"
        browser = Browser(self.chrome, self.tmp / f"profile-{self.pages}", WIDTH, HEIGHT)
        browser.call("Page.navigate", url=url)
        if not browser.wait(ready, timeout_s, settle_s=1.5):
            self.miss(name, f"the page did not get ready within {timeout_s:g} s ({ready}) at {url}")
        shot = browser.screenshot(self.shots / f"{name}.png")
        print(f"  {name}: {url}\n    screenshot {shot}")
        return contextlib.closing(browser)

    def read(self, name: str, path: str, ready: str, expression: str = "document.body.innerText",
             timeout_s: float = LOAD_S):
        """The value of `expression` on the page, once it is ready (the browser closed after)."""
        with self.visit(name, path, ready, timeout_s) as page:
            return page.evaluate(expression)

    def miss(self, name: str, what: str) -> None:
        self.missing.append(f"{name}: {what}")
        print(f"    MISSING {what}")


def first_screen(sweep: dict) -> list[tuple[str, str]]:
    """(column id, what it is) that must be in view on the runs page: the verdict (and the batch size where the points
    differ in it), then the mode's own answer (`ModeConf.first_screen`: replay's, LoadGen's) where its points have
    one, else the verified point's (tracking.FIRST_COLUMNS: the fastest backend, the error, its limit, p50, fingerprint)."""
    lead = ["tags.`verdict`", f"params.`{tracking.BATCH_PARAM}`"]
    first = sweep["columns"][:sweep["columns"].index("tags.`reason`")]
    own = [c for c in first if c in tracking.OWN_COLUMNS]
    shown = [c for c in first if c in lead] + (own or [c for c in first if c in tracking.FIRST_COLUMNS])
    named = {"tags.`verdict`": "the verdict", f"metrics.`{headline.logged_name(headline.ERROR)}`": "the error vs fp64"}
    return [(c, named.get(c, "the " + c.split("`")[1])) for c in shown][:tracking.FIRST_SCREEN]


def shows(text: str) -> str:
    """JavaScript: the page's text includes `text`."""
    return f"document.body.innerText.includes({json.dumps(text)})"


def run_path(sweep: dict, run_id: str, tab: str = "") -> str:
    """A run's page in the UI, or one of its tabs (model-metrics, artifacts/<file>)."""
    url = tracking.run_url(sweep["uri"], sweep["experiment_id"], run_id)
    return url.replace(f"/runs/{run_id}?", f"/runs/{run_id}/{tab}?") if tab else url


def with_metrics(check: Check, name: str, sweep: dict) -> dict | None:
    """The first child that has metrics (not a skipped one), or None after saying there is none."""
    child = next((c for c in sweep["children"] if c["headline"]), None)
    if child is None:
        check.miss(name, "no child with metrics to open")
    return child


def check_runs(check: Check, sweep: dict) -> None:
    name, children = "runs", sweep["children"]
    ready = (f"document.querySelectorAll('.ag-row[row-index]').length >= {len(children)} && "
             "document.querySelectorAll('.ag-header-cell[col-id]').length > 3")
    with check.visit(name, sweep["runs"], ready) as page:
        grid = page.evaluate(JS_GRID)
        if check.screenshot is not None:
            page.screenshot(check.screenshot)
            print(f"    and {check.screenshot}")
    headers, columns = grid["headers"], first_screen(sweep)
    for column, what in columns:
        if column not in headers:
            check.miss(name, f"no {what} column ({column}) on the first screen")  # not drawn: off-screen
        elif not headers[column]["seen"]:
            check.miss(name, f"{what} column ({column}) is not within the {WIDTH}x{HEIGHT} viewport "
                             f"(x {headers[column]['left']}..{headers[column]['right']})")
        elif headers[column]["cut"]:
            check.miss(name, f"{what} column's header ({column}) is cut")
    for group in grid["cutGroups"]:
        check.miss(name, f"the column group header {group!r} is cut")
    data = {c: h for c, h in headers.items() if c.startswith(("metrics.", "params.", "tags."))}
    first = min(data, key=lambda c: data[c]["left"]) if data else None
    if "tags.`verdict`" in headers and first not in (None, "tags.`verdict`"):
        check.miss(name, f"the verdict is not the first column after the run name (first: {first})")
    rows = {r.get("attributes.`Run Name`", {}).get("text", "").split("\n")[-1]: r for r in grid["rows"]}  # after its colour
    _check_points(check, name, children, rows, columns)
    print(f"    columns in view: {', '.join(c for c, _ in columns if headers.get(c, {}).get('seen'))}")


def _check_points(check: Check, name: str, children: list[dict], rows: dict, columns: list) -> None:
    """Every point listed with its name whole and its verdict (a skipped one's reason begun) in view; the first point
    with metrics showing their values."""
    for child in children:
        row = rows.get(child["name"])
        if row is None:
            check.miss(name, f"the point {child['name']} is not listed")
            continue
        if row.get("attributes.`Run Name`", {}).get("cut"):
            check.miss(name, f"{child['name']}: its name is cut in the name column")
        cell = row.get("tags.`verdict`", {"text": "", "seen": False})
        if not cell["seen"] or not cell["text"].startswith(child["status"]):
            check.miss(name, f"{child['name']}: verdict {cell['text']!r} does not read {child['status']!r} in view")
        elif cell.get("headCut"):  # its words before a reason (`failed as expected`); the reason may run on (`reason`)
            check.miss(name, f"{child['name']}: its verdict {child['verdict']!r} is cut ({cell['text']!r})")
        if child["status"] == "skipped" and child["reason"] and child["reason"][:12] not in cell["text"]:
            check.miss(name, f"{child['name']}: skipped without its reason in view ({cell['text']!r})")
    child = next((c for c in children if c["headline"]), None)
    if child is None:
        check.miss(name, "no point of the sweep has headline metrics")
        return
    for column, what in columns:
        cell = (rows.get(child["name"]) or {}).get(column)
        if column.startswith("metrics.") and (cell is None or cell["text"] in ("", "-") or not cell["seen"]):
            check.miss(name, f"{child['name']}: {what} shows {cell and cell['text']!r}, not its value, in view")


def lacks(check: Check, name: str, text: str, wanted: dict[str, str]) -> None:
    """Says each finding of `wanted` ({what the page must show: the finding}) whose text the page lacks."""
    for want, finding in wanted.items():
        if want not in text:
            check.miss(name, finding)


def check_root(check: Check, sweep: dict) -> None:
    text = check.read("root", "", shows(sweep["experiment"]))
    if sweep["parent"]["name"][:40] not in text:
        check.miss("root", "the experiment's description does not list the sweep on the home page")
    if "latest sweep" in text.lower():
        check.miss("root", "the experiment's description calls a sweep the latest (it shows above every sweep's runs)")
    link = json.dumps(f"a[href*='viewStateShareKey={sweep['sweep_id']}']")
    # in view, not hit-tested: on a first visit MLflow dims this page under its "Detect Issues" popover
    if not check.read("experiment", f"#/experiments/{sweep['experiment_id']}", f"!!document.querySelector({link})",
                      JS_SEEN + f"(() => {{ const a = document.querySelector({link}); return !!a && __inview(a); }})()"):
        check.miss("experiment", "the experiment page (what clicking the experiment opens) has no link to the sweep's "
                                 "runs in view")


def check_child(check: Check, sweep: dict) -> None:
    if (child := with_metrics(check, "child", sweep)) is None:
        return
    text = check.read("child", run_path(sweep, child["id"]), shows(child["headline"][0]))
    lacks(check, "child", text, {m: f"{child['name']}: headline metric {m} not on its page" for m in child["headline"]})


JS_SECTIONS = """(() => {  // the run page's chart sections, top to bottom: [name, charts] of each "<name> (<n>)" header
  const norm = e => (e.textContent || '').replace(/\\s+/g, ' ').trim(), out = [];
  for (const el of document.querySelectorAll('button, [role=button], [role=tab], div, span, h1, h2, h3, h4')) {
    const t = norm(el), m = t.length < 80 && t.match(/^(.+?) ?\\((\\d+)\\)$/);
    if (m && ![...el.children].some(c => norm(c) === t)) out.push([m[1], +m[2]]);
  }
  return out.filter((x, i) => !out.slice(0, i).some(y => y[0] === x[0]));
})()"""


def check_metrics(check: Check, sweep: dict) -> None:
    """A child's "Model metrics" tab: at most MAX_LOGGED charts, and first the section of the mode's answer, holding
    every `answer/` metric the run logged (accuracy after it where it is not the mode's answer: headline.answers)."""
    name = "metrics"
    if (child := with_metrics(check, name, sweep)) is None:
        return
    sections = check.read(name, run_path(sweep, child["id"], "model-metrics"), f"{JS_SECTIONS}.length > 0", JS_SECTIONS)
    charts, answer = sum(n for _, n in sections), [k for k in child["metrics"] if k.startswith(tracking.ANSWER)]
    print(f"    sections: {', '.join(f'{s} ({n})' for s, n in sections)}")
    if (sections[0] if sections else None) != [tracking.ANSWER.rstrip("/"), len(answer)]:
        check.miss(name, f"{child['name']}: the first chart section is {sections[0] if sections else 'none'!r}, not "
                         f"the answer's {len(answer)} charts ({', '.join(answer)})")
    if charts > headline.MAX_LOGGED or charts != len(child["metrics"]):
        check.miss(name, f"{child['name']}: {charts} charts for {len(child['metrics'])} metrics (at most {headline.MAX_LOGGED})")


def check_failed(check: Check, sweep: dict) -> None:
    """A failed point's run reads Failed (MLflow's status follows the verdict), not MLflow's green Finished; a case's
    expected failure reads Finished, its verdict `failed as expected` (the answer the case asked for)."""
    failed = [c for c in sweep["children"] if c["status"] == "failed"]
    if not failed:
        print("  failed: no failed point in this sweep")
    for child in failed:
        expected = child["verdict"].startswith("failed as expected")
        word = "Finished" if expected else "Failed"
        text = check.read("failed" + "-expected" * expected, run_path(sweep, child["id"]), shows(child["name"]))
        if not re.search(rf"Status\s+{word}", text):
            check.miss("failed", f"{child['name']}: {child['verdict'][:40]!r}, but its run's status does not read {word}")
        elif expected and "failed as expected" not in text:
            check.miss("failed", f"{child['name']}: an expected failure whose page does not say `failed as expected`")
        else:
            print(f"    {child['name']}: status {word}" + (", verdict failed as expected" if expected else ""))


def check_parent(check: Check, sweep: dict) -> None:
    """The parent's description, in view: its tally, the recommendation where there is one, and what the sweep found
    where it says (`Found`: replay's bitwise, dual benchmark and latency change; LoadGen's validity)."""
    parent, tally = sweep["parent"], sweep["parent"]["tally"]
    wanted = [tally[:20], "Recommended", "Found"]
    seen = check.read("parent", run_path(sweep, parent["id"]), shows(tally[:20]), JS_SEEN + "Object.fromEntries(%s.map("
                      "t => [t, __textSeen(t) || !document.body.innerText.includes(t) && null]))" % json.dumps(wanted))
    for text, what, needed in zip(wanted, (f"the tally ({tally!r})", "the recommendation", "what the sweep found "
                                           "(`Found ...`)"), (True, bool(parent["recommendation"]), False)):
        if seen.get(text) is False or needed and not seen.get(text):
            check.miss("parent", f"{what} is not in view in the parent's description")
    check_recommended(check, sweep)


def check_recommended(check: Check, sweep: dict) -> None:
    """Every pick names a dtype that really ran its figure (config.ran_dtype: onnxruntime's fp32 graph in a bf16 job is
    an fp32 figure), as the sweep's summary.json records the pick and its job."""
    summary = Path(sweep["report"] or "").with_name("summary.json")
    if not sweep["report"] or not summary.is_file():
        return
    found = json.loads(summary.read_text())
    rows = {r["job"]: r for r in found["rows"]}
    for where, rec in (found["comparison"].get("recommended") or {}).items():
        row = rows.get(rec.get("job"))
        if rec.get("dtype") and row and rec["dtype"].split("-")[0] != ran_dtype(rec["backend"], row["dtype"]):
            check.miss("parent", f"{where}: recommends {rec['dtype']} {rec['backend']}, but job {row['job']}'s "
                                 f"{rec['backend']} ran {ran_dtype(rec['backend'], row['dtype'])}")


def check_images(check: Check, sweep: dict) -> None:
    parent = sweep["parent"]
    for artifact in [a for a in parent["artifacts"] if a.endswith(".png")] + ["summary.md"]:
        if artifact not in parent["artifacts"]:
            check.miss("images", f"the parent has no {artifact}")
            continue
        name = "artifact-" + artifact.replace(".", "-")
        want = f"[...document.images].some(i => i.alt === {json.dumps(artifact)} || i.currentSrc.includes({json.dumps(quote(artifact))}) || i.currentSrc.includes('get-artifact'))"
        images, text = check.read(name, run_path(sweep, parent["id"], f"artifacts/{artifact}"),
                                  f"{want} && [...document.images].every(i => i.complete)",
                                  f"[{JS_IMAGES}, document.body.innerText]")
        mine = [i for i in images if i[0] == artifact or "get-artifact" in i[1] or quote(artifact) in i[1]]
        if not mine:
            check.miss(name, f"{artifact}: no image on its artifact page")
        for alt, src, _, natural in mine:
            if natural <= 0:
                check.miss(name, f"{artifact}: image {alt or src!r} did not decode (naturalWidth 0)")
        if artifact.endswith(".md") and "](" in text:
            check.miss(name, "summary.md shows an image as its link text")


def check_compare(check: Check, sweep: dict) -> None:
    name = "compare"
    passing = [c for c in sweep["children"] if c["status"] == "passed"]
    if len(passing) < 2:
        print(f"  {name}: fewer than two passing points, nothing to compare")
        return
    runs = quote(json.dumps([c["id"] for c in passing]))
    path = f"#/compare-runs?runs={runs}&experiments={quote(json.dumps([sweep['experiment_id']]))}"
    if sweep["uri"].startswith("http"):
        path = f"{sweep['uri'].rstrip('/')}/{path}"
    text = check.read(name, path, " && ".join(shows(c["name"]) for c in passing), JS_SCROLLED_TEXT)
    lacks(check, name, text, {c["name"]: f"{c['name']} is not in the compare view" for c in passing}
          | {m: f"headline metric {m} is not in the compare view" for c in passing for m in c["headline"]})
    if tracking.LIMIT_PARAM in {p for c in passing for p in c["params"]} and tracking.LIMIT_PARAM not in text:
        check.miss(name, f"the {tracking.LIMIT_PARAM} row is not in the compare view")


def check_report(check: Check, sweep: dict) -> None:
    """The HTML report from disk, then as the parent's artifact in MLflow's viewer."""
    report = Path(sweep["report"] or "report.html")
    if not report.is_file():
        check.miss("report-file", f"no {report} beside summary.md")
    else:
        text, images = check.read("report-file", report.resolve().as_uri(), "document.body && " + shows(
            sweep["parent"]["name"][:30]) + " && [...document.images].every(i => i.complete)",
            f"[document.body.innerText, {JS_IMAGES}]", 30)
        _report_content(check, "report-file", sweep, text, images)
    check_report_artifact(check, sweep)


def check_report_artifact(check: Check, sweep: dict) -> None:
    """The report in MLflow's artifact viewer: it draws .html in an iframe, read here through the frame's own context."""
    name = "report-artifact"
    parent = sweep["parent"]
    if "report.html" not in parent["artifacts"]:
        check.miss(name, "report.html is not an artifact of the parent")
        return
    path = run_path(sweep, parent["id"], "artifacts/report.html")
    with check.visit(name, path, "!!document.querySelector('iframe')") as page:
        text, images, deadline = "", [], time.time() + 30
        while frames := page.call("Page.getFrameTree")["frameTree"].get("childFrames", []):  # one tree (browser.py)
            world = page.call("Page.createIsolatedWorld", frameId=frames[0]["frame"]["id"])["executionContextId"]
            result = page.call("Runtime.evaluate", expression="JSON.stringify([document.body ? document.body.innerText : '', "
                               + JS_IMAGES + "])", contextId=world, returnByValue=True)
            text, images = json.loads(result["result"].get("value") or '["", []]')
            if sweep["parent"]["tally"][:20] in text and all(i[2] for i in images) or time.time() > deadline:
                break
            time.sleep(1)
        page.screenshot(check.shots / f"{name}.png")
        seen = page.evaluate(JS_SEEN + "(() => { const f = document.querySelector('iframe'); const r = f.getBoundingClientRect(); return r.height > 300 && r.width > 500; })()")
    if not frames:
        check.miss(name, "the artifact viewer shows no frame for report.html")
        return
    if not seen:
        check.miss(name, "the report's frame is too small to read")
    _report_content(check, name, sweep, text, images)


def _report_content(check: Check, name: str, sweep: dict, text: str, images: list) -> None:
    parent = sweep["parent"]
    wanted = ((parent["name"][:30], "the sweep's name"), (parent["tally"][:20], "the tally"),
              ("Verdicts", "the verdict table"), ("Environment", "the environment"))
    lacks(check, name, text, {want: f"the report lacks {what} ({want!r})" for want, what in wanted}
          | {c["name"]: f"the report's verdict table lacks {c['name']}" for c in sweep["children"]})
    if parent["recommendation"] and "Recommendation" not in text:
        check.miss(name, "the report lacks the recommendation")
    plots = [a for a in parent["artifacts"] if a.endswith(".png")]
    if len(images) < len(plots):
        check.miss(name, f"the report embeds {len(images)} image(s) for {len(plots)} plot(s)")
    for alt, src, _, natural in images:
        if natural <= 0:
            check.miss(name, f"the report's image {alt or src!r} did not decode")


PAGES = {"runs": check_runs, "root": check_root, "child": check_child, "metrics": check_metrics, "failed": check_failed,
         "parent": check_parent, "images": check_images, "compare": check_compare, "report": check_report}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=tracking.default_uri(), help="tracking URI (default: the repo's SQLite store)")
    parser.add_argument("--experiment", default=tracking.DEFAULT_EXPERIMENT)
    parser.add_argument("--sweep", default=None, help="sweep id (default: the latest sweep in the store)")
    parser.add_argument("--port", type=int, default=5000, help="port for `mlflow ui` (the next free one if taken); "
                        "the sweep's tracking.ui_port, so summary.md's images point at this UI")
    parser.add_argument("--ui", default=None, help="check a UI that is already running at this address instead")
    parser.add_argument("--only", nargs="+", choices=list(PAGES), help="check these pages only (default: all)")
    parser.add_argument("--shots", type=Path, default=None, help="folder for the screenshots (default: a temporary one)")
    parser.add_argument("--screenshot", type=Path, default=None, help="also save the runs page here (docs/ui_runs.png)")
    args = parser.parse_args(argv)
    chrome = find_browser()
    if chrome is None:
        print("error: needs a headless Chromium (Debian: apt-get install chromium); none of chromium, "
              "chromium-browser, google-chrome is on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="huggy-ui-") as tmp:
        shots = args.shots or Path(tmp) / "shots"
        shots.mkdir(parents=True, exist_ok=True)
        server, base = None, ""
        try:
            sweep = tracking.sweep_runs({"uri": args.store, "experiment": args.experiment}, args.sweep)
            if args.ui:
                base = args.ui.rstrip("/")
            elif not sweep["uri"].startswith("http"):
                port = ui.free_port(args.port)
                started = time.time()
                server = ui.start(sweep["uri"], port, Path(tmp) / "mlflow-ui.log", 240)
                base = f"http://{ui.HOST}:{port}"
                print(f"mlflow ui on {base} answered after {time.time() - started:.0f} s")
            print(f"sweep {sweep['sweep_id']}: parent {sweep['parent']['name']!r}, {len(sweep['children'])} points; "
                  f"screenshots in {shots}")
            check = Check(chrome, base, shots, Path(tmp), args.screenshot)
            for page in args.only or PAGES:
                PAGES[page](check, sweep)
        except (UserError, BrowserError, tracking.StoreDown) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            if server is not None:
                ui.stop(server)
    for line in check.missing:
        print(f"MISSING {line}")
    print("ui check: " + ("passed" if not check.missing else f"{len(check.missing)} thing(s) missing"))
    return 1 if check.missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
