"""Render a sweep in the real MLflow UI (headless Chromium against `mlflow ui` on 127.0.0.1) and check what a person sees.

    python scripts/ui_check.py [--store sqlite:///mlruns/mlflow.db] [--sweep <sweep id>] [--screenshot docs/ui_runs.png]

Checks, on the pages the sweep's printed URLs open: the sweep's runs view lists the parent and every child with the
headline metric columns; the parent's page carries its tally and comparison; its artifacts list the summary files and
the comparison plot renders as an image; a child's page shows its headline metrics. Exit 0 when all hold, 1 with
what is missing, 2 when it cannot run (no Chromium: Debian `apt-get install chromium`; no such sweep or store).
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from huggy_exp import tracking  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WAIT_S = 90


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(uri: str, port: int, log: Path) -> subprocess.Popen:
    """`mlflow ui` on loopback, in its own process group (stopped with everything it started); waits for /health."""
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "ui", "--backend-store-uri", uri,
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)
    deadline = time.time() + WAIT_S
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                stop(server)
                raise SystemExit(f"error: mlflow ui did not start within {WAIT_S} s; its log: {log}")
            time.sleep(0.5)


def stop(server: subprocess.Popen) -> None:
    with_group = lambda sig: os.killpg(server.pid, sig)  # noqa: E731
    try:
        with_group(signal.SIGTERM)
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with_group(signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def render(chrome: str, url: str, profile: Path, screenshot: Path | None = None) -> str:
    """The page's DOM after its scripts ran (virtual time), or a PNG of it when `screenshot` is given."""
    args = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
            "--virtual-time-budget=20000"]
    # the runs table draws only the rows and columns in its viewport: a huge window puts a whole sweep in it
    args += [f"--screenshot={screenshot}", "--window-size=1600,800"] if screenshot else ["--dump-dom", "--window-size=8000,6000"]
    proc = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
    return proc.stdout


def visible_text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))


def check(chrome: str, base: str, sweep: dict, profile: Path, screenshot: Path | None) -> list[str]:
    """What is missing from the pages; empty when everything is there."""
    exp, parent, children = sweep["experiment_id"], sweep["parent"], sweep["children"]
    missing = []
    pages = {
        "runs view": tracking.run_url(sweep["uri"], exp, view=sweep["sweep_id"]),
        "parent run": tracking.run_url(sweep["uri"], exp, parent["id"]),
        "child run": tracking.run_url(sweep["uri"], exp, children[0]["id"]) if children else None,
    }
    plots = [a for a in parent["artifacts"] if a.endswith(".png")]
    if plots:
        pages["parent plot"] = tracking.run_url(sweep["uri"], exp, parent["id"]).replace(
            f"/runs/{parent['id']}?", f"/runs/{parent['id']}/artifacts/{plots[0]}?")
    for name, path in pages.items():
        if path is None:
            missing.append("the sweep has no child run")
            continue
        url = path if path.startswith("http") else f"{base}/{path}"
        dom = render(chrome, url, profile)
        text = visible_text(dom)
        want: list[str] = []
        if name == "runs view":
            want = [parent["name"], *(c["name"] for c in children), *{m for c in children for m in c["headline"]}]
        elif name == "parent run":
            want = [parent["name"], "jobs_passed"]
            if not any(c["name"] in text for c in children):  # the page lists the first children, not always all
                missing.append(f"{name}: none of its child runs is listed at {url}")
        elif name == "child run":
            want = [children[0]["name"], *children[0]["headline"]]
        elif name == "parent plot":
            if not re.search(rf'<img[^>]*alt="{re.escape(plots[0])}"[^>]*src="blob:', dom):
                missing.append(f"{name}: {plots[0]} is not rendered as an image at {url}")
            want = [a for a in parent["artifacts"] if a.startswith("summary")]
        missing += [f"{name}: {w!r} not on the page {url}" for w in dict.fromkeys(want) if w not in text]
        print(f"  {name}: {url} -> {'ok' if not any(m.startswith(name) for m in missing) else 'MISSING'}")
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        path = pages["runs view"]
        render(chrome, path if path.startswith("http") else f"{base}/{path}", profile, screenshot)
        print(f"  screenshot: {screenshot}")
    return missing


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=tracking.default_uri(), help="tracking URI (default: the repo's SQLite store)")
    parser.add_argument("--experiment", default=tracking.DEFAULT_EXPERIMENT)
    parser.add_argument("--sweep", default=None, help="sweep id (default: the latest sweep in the store)")
    parser.add_argument("--screenshot", type=Path, default=None, help="also save a PNG of the sweep's runs view")
    args = parser.parse_args(argv)
    chrome = browser()
    if chrome is None:
        print("error: needs a headless Chromium (Debian: apt-get install chromium); none of "
              f"{', '.join(BROWSERS)} is on PATH", file=sys.stderr)
        return 2
    settings = {"uri": args.store, "experiment": args.experiment}
    try:
        sweep = tracking.sweep_runs(settings, args.sweep)
    except tracking.StoreDown as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="huggy-ui-") as tmp:
        server = None
        base = ""
        if not sweep["uri"].startswith("http"):
            port = free_port()
            server = start_ui(sweep["uri"], port, Path(tmp) / "mlflow-ui.log")
            base = f"http://127.0.0.1:{port}"
        try:
            print(f"sweep {sweep['sweep_id']}: parent {sweep['parent']['name']}, {len(sweep['children'])} children")
            missing = check(chrome, base, sweep, Path(tmp) / "profile", args.screenshot)
        finally:
            if server is not None:
                stop(server)
    for line in missing:
        print(f"MISSING {line}")
    print("ui check: " + ("passed" if not missing else f"{len(missing)} thing(s) missing"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
