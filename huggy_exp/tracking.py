"""The only module that imports mlflow. A job's record is its result.json; MLflow gets a copy of it, or it stays pending.

Guarantees: a SQLite store is created and written under one file lock (concurrent first runs cannot race in its
schema migration); a run is never left RUNNING (any exception, Ctrl-C included, ends it FAILED or KILLED); a job
that could not be logged is `pending` in its result.json and `python run.py mode=sync` logs it exactly once (the
job's `job_id` tag is looked up first); an unreachable or unwritable store is found by a probe of a few seconds,
once per sweep (later points of that sweep go straight to pending).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import functools
import json
import math
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

from huggy_exp.environment import flatten
from huggy_exp.errors import UserError
from huggy_exp.headline import (ANSWER, ANSWER_ORDER, COSINE, ERROR, fastest_backend, judged_limits,
                                logged_metrics, logged_name, noisy, settings, timed_batch)
from huggy_exp.report import OWN_ANSWERS, escape, fmt
from huggy_exp.config import VERDICTS, modes, ran_dtype
from huggy_exp.results import update_result
from huggy_exp.files import atomic_write, atomic_write_text, disk_full_message, flock, is_disk_full
from huggy_exp.foreign import MAX_JSON_BYTES, read_capped, read_json
from huggy_exp.host import free_bytes, size

REPO = Path(__file__).resolve().parents[1]
DEFAULT_EXPERIMENT = "huggy_exp"
MAX_PARAM_CHARS = 6000
MAX_TAG_CHARS = 5000
SWEEP_FILE = "sweep.json"  # in a sweep dir: the sweep id, its parent run, and whether the store answered
PROBE_TIMEOUT_S = 3.0
ENV_TAGS = ("host", "python", "platform", "torch", "torch_npu", "onnxruntime", "onnx", "numpy", "hydra_core", "mlflow")


class StoreDown(Exception):
    """The store cannot be reached or written: the job stays pending, with this as its reason."""


def default_uri() -> str:
    return f"sqlite:///{REPO / 'mlruns' / 'mlflow.db'}"


def store_uri(uri: str | None) -> str:
    """The URI MLflow's client gets: a server's `user:password@` moved out (use_credentials), hidden secrets back."""
    clean = use_credentials(uri) if uri else default_uri()
    return _secrets().get(clean, clean)


# --- credentials: never printed or stored; MLflow gets them from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD

# a URI's `user:password@`: the password runs to the last `@` before the host (a raw `@` or `/` in it is still masked)
USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<user>[^:/\s'\"]*):(?P<password>[^\s'\"]*?)@"
                      r"(?=[^@/?#\s'\"]*(?:[/?#\s'\"]|$))", re.I)
# the password as SQLAlchemy's make_url reads a database URI (rfc1738: it ends at the first `@`)
DRIVER_PASSWORD = re.compile(r"[\w+]+://[^:/]*:(?P<password>[^@]*)@")
# a query parameter that carries a secret: ?token=, &password=, &api_key=, &X-Amz-Signature=, &sig=, ...
SECRET_QUERY = re.compile(r"(?P<key>[?&;][\w.-]*(?:token|passw(?:or)?d|pwd|secret|key|auth|credential|signature|sig)[\w.-]*=)"
                          r"(?P<value>[^&;#\s'\"]+)", re.I)
SECRETS_ENV = "HUGGY_EXP_TRACKING_SECRETS"  # {redacted URI: the URI}: a store URI's secrets, never in Hydra's files
# what a process logging for this one needs to reach the store (a Ray worker, the tracking helper started before the
# command line's or a config file's credentials were moved here)
CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", SECRETS_ENV)


def redact(text: object) -> str:
    """Any `scheme://user:password@` in the text as `scheme://user:***@`, and a secret query value as `?token=***`."""
    text = USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", str(text))
    return SECRET_QUERY.sub(lambda m: f"{m['key']}***", text)


def hide_secrets(uri: str) -> str:
    """The store URI as Hydra may write it (`.hydra/`, result.json): a server's `user:password@` moved into MLflow's
    variables (use_credentials); any other secret (a database password, a `?token=`) kept in this process's
    environment (SECRETS_ENV, inherited by the jobs) under the redacted URI, which store_uri() maps back."""
    clean = use_credentials(uri)
    found = USERINFO.search(clean)
    if found and found["password"] != _client_password(clean):
        raise UserError("tracking.uri: its password cannot be read as the store's client reads it (a raw '@', or a raw "
                        "'/' in a server's); percent-encode them (@ as %40, / as %2F); the URI is not shown")
    shown = redact(clean)
    if shown != clean:
        os.environ[SECRETS_ENV] = json.dumps({**_secrets(), shown: clean})
    return shown


def _client_password(uri: str) -> str | None:
    """The raw password the store's client reads from a URI: urllib's for a server, SQLAlchemy's for a database."""
    if (p := urlparse(uri)).scheme in ("http", "https"):
        return p.netloc.rpartition("@")[0].partition(":")[2] if "@" in p.netloc else None
    found = DRIVER_PASSWORD.match(uri)
    return found["password"] if found else None


def _secrets() -> dict:
    with contextlib.suppress(ValueError):
        found = json.loads(os.environ.get(SECRETS_ENV) or "{}")
        return found if isinstance(found, dict) else {}
    return {}


def use_credentials(uri: str) -> str:
    """A server URI's `user:password@` moved into MLflow's own variables (the URI's win); databases keep theirs."""
    p = urlparse(uri)
    if p.scheme not in ("http", "https") or "@" not in p.netloc:
        return uri
    os.environ["MLFLOW_TRACKING_USERNAME"] = unquote(p.username or "")
    os.environ["MLFLOW_TRACKING_PASSWORD"] = unquote(p.password or "")
    return p._replace(netloc=p.netloc.rsplit("@", 1)[1]).geturl()


def public_settings(settings: dict) -> dict:
    """The tracking settings as result.json and MLflow may record them: the URI's password masked."""
    return {**settings, "uri": redact(settings["uri"])} if settings.get("uri") else dict(settings)


def _auth_headers() -> dict[str, str]:
    """What MLflow's client sends: basic auth from MLFLOW_TRACKING_USERNAME/PASSWORD, or MLFLOW_TRACKING_TOKEN."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user is not None and password is not None:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


# --- the store: where it is, whether it answers, its lock, MLflow imported once


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def local_store(uri: str | None) -> Path | None:
    """The database file of a SQLite store (absolute), None for a server."""
    db = _sqlite_path(store_uri(uri))
    return db.expanduser().absolute() if db else None


def check_uri(uri: str) -> None:
    """MLflow >= 3.13 refuses a plain folder store; say so before any job runs."""
    scheme, shown = urlparse(uri).scheme, redact(uri)
    if scheme in ("", "file"):
        raise StoreDown(f"tracking.uri={shown!r}: MLflow 3 needs a database or server store, e.g. sqlite:///path/mlflow.db")
    if scheme not in ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks"):
        raise StoreDown(f"tracking.uri={shown!r}: unknown scheme {scheme!r}; use sqlite:///path/mlflow.db or http://host:port")
    if scheme == "sqlite":
        db = _sqlite_path(uri)
        if db is None or str(db) in ("", ".") or ":memory:" in uri or "mode=memory" in uri:
            raise StoreDown(f"tracking.uri={shown!r} is an in-memory SQLite store: every run would vanish when the job "
                            "ends; give a file, sqlite:///<folder>/mlflow.db")
        if "?" in uri:
            raise StoreDown(f"tracking.uri={shown!r}: a SQLite store takes no query ({shown[shown.find('?'):]}): "
                            "MLflow would create a file of that name; give sqlite:///<folder>/mlflow.db")


SQLITE_MAGIC = b"SQLite format 3\x00"
MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}  # a SQLite file with a schema but none of these is no store


def probe(uri: str) -> None:
    """Seconds, not minutes, and one line: a SQLite store that is not a writable database file (a folder, another kind
    of file, a read-only one), or a server that does not answer /health (with the credentials MLflow will send)."""
    check_uri(uri)
    db = _sqlite_path(uri)
    if db is not None:
        try:
            if db.exists() and not db.is_file():
                raise StoreDown(f"MLflow store {db} is a {'folder' if db.is_dir() else 'special file'}, not a SQLite "
                                "database file: give tracking.uri=sqlite:///<folder>/mlflow.db")
            db.parent.mkdir(parents=True, exist_ok=True)
            open(_lock_path(db), "a").close()
            if db.exists() and not os.access(db, os.W_OK):
                raise PermissionError(f"{db} is read-only")
            if db.exists() and db.stat().st_size:
                with open(db, "rb") as fh:
                    head = fh.read(len(SQLITE_MAGIC))
                if head != SQLITE_MAGIC:
                    raise StoreDown(f"MLflow store {db} is not a SQLite database; move it aside (mv {db} {db}.broken), "
                                    "then `python run.py mode=sync` logs every pending result.json into a fresh store")
                # read-write, never creating: a process killed mid-transaction leaves a hot journal that only a
                # writable connection rolls back (a read-only one reads "attempt to write a readonly database")
                with contextlib.closing(sqlite3.connect(db.absolute().as_uri() + "?mode=rw", uri=True, timeout=PROBE_TIMEOUT_S)) as con:
                    schema = con.execute("SELECT type, name FROM sqlite_master").fetchall()
                tables = {name for kind, name in schema if kind == "table"}
                if schema and not MLFLOW_TABLES & tables:  # another application's database: MLflow would add its tables
                    # (any one of MLflow's tables: a store another process is migrating right now has some of them)
                    tables = tables or {name for _, name in schema}
                    raise StoreDown(f"MLflow store {db} is another application's SQLite database (tables "
                                    f"{', '.join(sorted(tables)[:4])}{', ...' if len(tables) > 4 else ''}), not an MLflow "
                                    "store: give tracking.uri=sqlite:///<folder>/mlflow.db")
        except sqlite3.Error as exc:
            raise StoreDown(f"MLflow store {db} cannot be opened as SQLite ({exc}); move it aside "
                            f"(mv {db} {db}.broken) and sync into a fresh one") from None
        except OSError as exc:
            raise StoreDown(f"MLflow store {db} is not writable ({exc.strerror or exc})") from None
        return
    if urlparse(uri).scheme in ("http", "https"):
        request = urllib.request.Request(use_credentials(uri).rstrip("/") + "/health", headers=_auth_headers())
        try:
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as reply:
                reply.read(64)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StoreDown(f"tracking server {redact(uri)} did not answer within {PROBE_TIMEOUT_S:g} s ({reason})") from None


def _lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".lock")


def store_lock(uri: str):
    """One writer at a time on a SQLite store, across processes; no-op for servers (they serialise themselves)."""
    db = _sqlite_path(uri)
    if db is None:
        return contextlib.nullcontext()
    db.parent.mkdir(parents=True, exist_ok=True)
    return flock(_lock_path(db), create=True)


def http_limits(settings: dict) -> None:
    """Bound MLflow's HTTP retries (its defaults wait ~4 minutes on a server that is down); variables set win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(int(settings.get("http_retries", 2))))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(settings.get("http_timeout_s", 10))))


def _mlflow():
    """Import mlflow (1.4 s, so only here) with its INFO chatter about database migrations silenced."""
    import logging

    import mlflow

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # it logs a database error with its traceback, then raises it: the caller reports that in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    return mlflow


def preload() -> None:
    """Import mlflow and its SQLAlchemy store (2-3 s of CPU, no I/O): what a helper process does before the job ends."""
    _mlflow()
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (SQLite stores; servers skip it, it is only imported)


def _forget_stores() -> None:
    """MLflow caches one store and one SQLAlchemy engine (open SQLite connections) per URI; after a failure the next
    try must build fresh ones, or a store moved aside and recreated keeps answering from the broken file."""
    with contextlib.suppress(Exception):  # private caches: if they move, a long-lived process keeps the old store
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
        with SqlAlchemyStore._engine_map_lock:
            for engine in SqlAlchemyStore._engine_map.values():
                engine.dispose()
            SqlAlchemyStore._engine_map.clear()


def _explain(uri: str, exc: BaseException) -> str:
    """One line; a full disk, or a SQLite store broken by an interrupted migration (or no database at all): the fix."""
    if isinstance(exc, StoreDown):
        return str(exc)
    if is_disk_full(exc):
        return disk_full_message(exc)
    text = redact(" ".join(str(exc).split()) or type(exc).__name__)
    db = _sqlite_path(uri)
    if db is not None and "database or disk is full" in text:
        return (f"MLflow store {db}: its disk is full ({size(free_bytes(db))} free there); free some space, then "
                "`python run.py mode=sync` logs the pending results")
    if db is not None and any(s in text for s in ("alembic", "file is not a database", "no such table", "malformed")):
        return (f"MLflow store {db} is broken ({text[:160]}); move it aside (mv {db} {db}.broken), then "
                f"`python run.py mode=sync` logs every pending result.json into a fresh store")
    return f"{type(exc).__name__}: {text[:300]}"


# --- a new SQLite store starts as a copy of an empty one MLflow built: its ~50 schema migrations run once per install


def _seed_sqlite(uri: str) -> None:
    """A SQLite store that does not exist yet becomes a copy of an empty one at this MLflow's schema head, which MLflow
    builds once per version in the cache dir (not writable: MLflow migrates the store). It holds no experiment: MLflow
    creates Default in the copy with its own artifact root, as in a database it migrated. Call under store_lock."""
    db = _sqlite_path(uri)
    if db is None or db.exists():
        return
    mlflow = _mlflow()
    from huggy_exp.mlagents.default import cache_dir

    template = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    if not template.is_file():
        try:
            template.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return

        def build(tmp: str) -> None:  # MLflow migrates the empty temporary file, then its experiments are dropped
            mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()
            _forget_stores()  # close the engine before the file is edited and moved
            with contextlib.closing(sqlite3.connect(tmp)) as con:
                con.executescript("DELETE FROM experiment_tags; DELETE FROM experiments; VACUUM;")

        atomic_write(template, build)  # two first runs at once each build one, and either is complete
    atomic_write(db, lambda tmp: shutil.copyfile(template, tmp))


class Store:
    """An open MLflow client on one store and experiment; create with `Store.open` (locks SQLite while migrating)."""

    def __init__(self, uri: str, experiment: str, user: str | None = None):
        self.uri, self.experiment, self.user = uri, experiment, user
        self.client = _mlflow().MlflowClient(tracking_uri=uri)
        self.experiment_id = self._ensure_experiment()

    @classmethod
    def open(cls, settings: dict) -> Store:
        uri = store_uri(settings.get("uri"))
        http_limits(settings)
        probe(uri)
        try:
            with store_lock(uri):
                _seed_sqlite(uri)
                return cls(uri, settings.get("experiment") or DEFAULT_EXPERIMENT, settings.get("user"))
        except Exception as exc:
            _forget_stores()
            raise StoreDown(_explain(uri, exc)) from None

    def _ensure_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.experiment)
        if found is None:
            db = _sqlite_path(self.uri)  # artifacts live beside a SQLite store (mlruns/ by default); a server chooses
            try:
                return self.client.create_experiment(self.experiment, artifact_location=db and db.parent.as_uri())
            except MlflowException:  # another process created it meanwhile, else the error stands
                found = self.client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
        return found.experiment_id

    def runs(self, where: str, n: int = 5000, **kw) -> list:
        """The experiment's active runs (unless `run_view_type` says otherwise) that match the filter `where`."""
        return self.client.search_runs([self.experiment_id], filter_string=where, max_results=n, **kw)

    def children(self, parent_id: str, also: str = "") -> list:
        """The runs of a sweep's parent (`also`: a further filter clause)."""
        return self.runs(f"tags.`mlflow.parentRunId` = '{parent_id}'" + also)

    def sweeps(self, n: int, also: str = "") -> list:
        """The sweeps' parent runs, newest first."""
        return self.runs(f"tags.`{PARENT_TAG}` = 'true'" + also, n, order_by=["attributes.start_time DESC"])


# --- the UI: run URLs and the columns a sweep's view opens on

UI_VIEW = "workflowType=machine_learning"  # MLflow 3 UI: without it an experiment opens on its GenAI (traces) pages
SHARED_VIEW = "mlflow.sharedViewState."  # experiment tag the UI reads for `?viewStateShareKey=<key>` (its Share button)
PARENT_TAG = "huggy.parent"
SWEEP_DIR_TAG = "huggy.sweep_dir"  # on the parent: the sweep's folder (summary.md, report.html)
LIMIT_PARAM = "limit/max_abs"
BATCH_PARAM = "batch_size"
VIEW_PARAMS = ("device", "dtype", BATCH_PARAM, "mode", "obs.source", "seed")
FINGERPRINT_COLUMN = "tags.`fingerprint`"
# the runs table's first screen, after the run name and the verdict (and the batch size where the sweep's points
# differ in it), those the sweep's runs have: a benchmark's fastest backend at the job's batch (p50, which, obs/s) and
# eager's p50; the error vs fp64 with its limit, the p50 (as the answer, or after a mode's own answer), the fingerprint
# prefix, then the cosine (whose 0.99999… says less than the error beside its limit); then the rest
FIRST_COLUMNS = tuple(dict.fromkeys(c if "`" in c else f"metrics.`{logged_name(c, answer)}`" for c in (
    "best_p50_us", "tags.`best_backend`", "best_obs_per_s", "metrics.`eager/p50_us`", ERROR, f"params.`{LIMIT_PARAM}`",
    "p50_us", FINGERPRINT_COLUMN, COSINE) for answer in (True, False)))
FIRST_SCREEN = 5  # the verdict and the next four columns: what a sweep's first screen shows (scripts/ui_check.py)
OWN_COLUMNS = tuple(dict.fromkeys(f"metrics.`{logged_name(n)}`" for m in modes().values() for n in m.first_screen))
# px: the verdict's, then every other column as wide as its header needs (HEADER_PX), so that the verdict and the
# next four fit in the 623 px MLflow leaves beside its own name column at 1600 px with its Assistant panel open; the
# batch size's, alone under MLflow's "Parameters" group header, as wide as that needs
WIDTHS = {"verdict": 112, "reason": 440, "created": 44, BATCH_PARAM: 96}  # by header
HEADER_PX = (7.0, 12)  # px per character of a header (MLflow's 600 12px font: at most 6.9) and its left padding
VERDICT_PX = (6.5, 28)  # px per character of a cell's words (13px: `passed, noisy` is 73 px) and both paddings
NAME_COLUMN = "attributes.`Run Name`"
NAME_PX = (182, 7.0, 30)  # MLflow's own name column width; px per character of a name and for its colour dot


def run_url(uri: str, experiment_id: str, run_id: str | None = None, view: str | None = None) -> str:
    """`#/experiments/<id>/runs[/<run>]?workflowType=machine_learning[&viewStateShareKey=<view>]`; servers prefixed."""
    path = (f"#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "") + f"?{UI_VIEW}"
            + (f"&viewStateShareKey={view}" if view else ""))
    return f"{redact(uri).rstrip('/')}/{path}" if urlparse(uri).scheme in ("http", "https") else path


def ui_link(settings: dict, experiment_id: str, run_id: str | None = None, view: str | None = None) -> str:
    """Where a person opens a run or a sweep's runs: a server's address, else mode=ui's (and the command serving it)."""
    uri = store_uri(settings.get("uri"))
    url = run_url(uri, experiment_id, run_id, view)
    if url.startswith("http"):
        return url
    store = "" if uri == default_uri() else f" tracking.uri={redact(uri)}"
    return f"http://127.0.0.1:{int(settings.get('ui_port') or 5000)}/{url} (`python run.py mode=ui{store}` serves it)"


def view_columns(present: set[str], batches: int = 1) -> list[str]:
    """The runs table's MLflow column ids in display order for runs with the columns `present` (`present_columns`) over
    `batches` batch sizes: the verdict, the modes' own answers (`first_screen`), FIRST_COLUMNS, then the rest."""
    own = [c for c in OWN_COLUMNS if c in present]
    first = own + [c for c in FIRST_COLUMNS if (c in present or c == FINGERPRINT_COLUMN) and c not in own]
    answer = [f"metrics.`{logged_name(n)}`" for n in ANSWER_ORDER if n != "passed"]  # the verdict says passed in words
    rest = sorted((c for c in present if c.startswith(f"metrics.`{ANSWER}") and c not in first
                   and c != f"metrics.`{ANSWER}passed`"), key=lambda c: (c not in answer, answer.index(c) if c in answer else 0, c))
    batch = [f"params.`{BATCH_PARAM}`"] if batches > 1 else []
    return ["tags.`verdict`", *batch, *first, "tags.`reason`", *rest,
            *(f"params.`{p}`" for p in VIEW_PARAMS if f"params.`{p}`" not in batch), "tags.`case`"]


def present_columns(runs) -> tuple[set[str], int]:
    """`view_columns`' arguments: the column ids of what MLflow `runs` logged, and how many batch sizes they ran."""
    kinds = ("metrics", "params", "tags")
    return ({f"{kind}.`{k}`" for run in runs for kind in kinds for k in getattr(run.data, kind)},
            len({run.data.params.get(BATCH_PARAM) for run in runs}))


def sweep_view(sweep_id: str, present: set[str], batches: int = 1, names: list[str] = (),
               verdicts: list[str] = ()) -> str:
    """One sweep's runs table as MLflow's shared view state: its points flat (a filter un-nests children), by name, the
    columns narrow enough to fit beside MLflow's Assistant panel (a quarter of the window on a first visit); the name
    column as wide as the longest point's name (`names`) needs, so a benchmark's batch size at its end is not cut, and
    the verdict's as its longest words before a reason (`verdicts`: a case's `failed as expected`)."""
    columns = view_columns(present, batches)
    shown = columns[:columns.index("tags.`reason`") + 1]
    widths = {c: WIDTHS.get(h := c.split("`")[1], round(HEADER_PX[0] * len(h) + HEADER_PX[1])) for c in shown}
    widths["tags.`verdict`"] = max([WIDTHS["verdict"], *(round(VERDICT_PX[0] * len(v.split(": ")[0]) + VERDICT_PX[1])
                                                         for v in verdicts)])
    widths["runDateAndNestInfo"] = WIDTHS["created"]  # "Created" is pinned beside the name: its icon is enough
    widths[NAME_COLUMN] = max(NAME_PX[0], round(NAME_PX[1] * max(map(len, names), default=0) + NAME_PX[2]))
    return json.dumps({"selectedColumns": columns, "searchFilter": f"tags.sweep_id = '{sweep_id}'",
                       "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
                       "columnOrder": [NAME_COLUMN, "runDateAndNestInfo", *columns], "columnWidths": widths})


# --- one job


def log_job(settings: dict, workdir: Path, retry_down: bool = False, foreign: bool = False) -> dict:
    """Copy the job's result.json (+ artifacts) into MLflow; returns the tracking outcome for result.json. For sync:
    `retry_down` tries a store this sweep found down; `foreign`: a result.json this process did not write (only files
    inside its folder go up)."""
    if not settings.get("enabled", True):
        return {"status": "off"}
    with flock(workdir):  # one logger per job at a time (a job and a sync, two syncs), on any store
        record, state = read_record(workdir / "result.json")
        if state == "logged":  # another process logged it while we waited
            return record["tracking"]
        sweep = read_sweep(Path(record["sweep"]["dir"])) if record.get("sweep") else None
        if sweep and sweep.get("tracking", {}).get("status") == "down" and not retry_down:
            return {"status": "pending", "reason": sweep["tracking"]["reason"]}
        try:
            values = run_values(record)
            if foreign:  # before the store is touched: a value MLflow refuses is skipped in one line, not retried forever
                check_loggable(record["run_name"], run_tags(record, None), *values)
            store = Store.open(settings)
            with store_lock(store.uri):
                return _log_job(store, record, workdir, sweep, values, foreign)
        except UserError:
            raise
        except Exception as exc:  # tracking is best effort; the job's result is already on disk
            reason = _explain(store_uri(settings.get("uri")), exc)
            if sweep and isinstance(exc, StoreDown):
                mark_sweep_down(Path(record["sweep"]["dir"]), reason)
            return {"status": "pending", "reason": reason}


def _log_job(store: Store, record: dict, workdir: Path, sweep: dict | None, values: tuple, foreign: bool) -> dict:
    for old in store.runs(f"tags.`huggy.job_id` = '{record['job_id']}'", 10):
        if old.data.tags.get("huggy.complete") == "true":  # exactly once: a complete copy is kept, a partial replaced
            return _logged(store, old.info.run_id, record)
        _end(store, old, "FAILED", "partial copy: logging stopped before it was complete; replaced by a complete one",
             delete=True)
    params, metrics, started, ended = values
    parent = _parent_id(store, sweep)
    run_id = store.client.create_run(store.experiment_id, run_name=record["run_name"], tags=run_tags(record, parent, store.user),
                                     start_time=started).info.run_id
    logged = _logged(store, run_id, record, parent)
    try:
        store.client.log_batch(run_id, metrics=metrics, params=params)  # the client splits it into MLflow's batches
        # on disk "logging" (sync retries it) until the run is complete; the copy in MLflow says where it lives
        update_result(workdir, tracking={**logged, "status": "logging"})
        with tempfile.TemporaryDirectory() as tmp:  # every artifact in one upload: one call, not one per file
            _stage_artifacts({**record, "tracking": logged}, workdir, Path(tmp), foreign)
            store.client.log_artifacts(run_id, tmp)
        store.client.set_tag(run_id, "huggy.complete", "true")
        store.client.set_terminated(run_id, run_status(record), end_time=max(ended, started))
    except BaseException as exc:  # end the run first: on a full disk the result.json update below may fail too
        with contextlib.suppress(Exception):
            store.client.set_terminated(run_id, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        with contextlib.suppress(OSError):
            update_result(workdir, tracking={"status": "pending", "reason": f"logging interrupted ({type(exc).__name__}); "
                                             f"partial run {run_id} ended, sync replaces it"})
        raise
    return logged


METRICS_TABLE = "metrics.csv"  # every metric of the job (and each series point), beside the few MLflow charts


def _stage_artifacts(record: dict, workdir: Path, stage: Path, foreign: bool) -> None:
    """The run's artifacts in `stage` as links to the checked files (the upload copies what they point at): result.json
    as logged, metrics.csv, a config file holding a URI password redacted, a file in a job-dir folder in that folder
    (loadgen/<scenario>/...), the rest at the top. `foreign`: only files inside the job's folder (`artifacts`)."""
    (stage / "result.json").write_text(json.dumps(record, indent=2))
    metrics, series = record.get("metrics") or {}, record.get("series") or {}
    rows = [("name", "step", "value"), *((k, "", v) for k, v in metrics.items()),  # a series point has its step
            *((k, step, v) for k, points in series.items() for step, v in points)]  # (e.g. the batch size)
    with open(stage / METRICS_TABLE, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    for path in artifacts(record, workdir, inside_only=foreign):
        folder = path.parent.relative_to(workdir) if path.is_relative_to(workdir) else Path(".")
        target = stage / (folder if str(folder) != "." and not folder.parts[0].startswith(".") else Path(".")) / path.name
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".yaml" and redact(text := read_capped(path, MAX_JSON_BYTES, "config").decode(errors="replace")) != text:
            target.write_text(redact(text))  # Hydra's copy of a config file that holds a URI password
        else:
            target.symlink_to(path.resolve())


def run_values(record: dict) -> tuple[list, list, int, int]:
    """(params, metrics, start and end in epoch ms) of a job's MLflow run."""
    from mlflow.entities import Metric, Param

    started, ended = job_times(record)
    flat = {"mode": record["mode"], **flatten(settings(record.get("params", {}), record["dtype"])), **limit_params(record)}
    params = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in flat.items()  # unset (None) settings: table noise
              if v is not None and not _per_dtype(k, record["dtype"])]
    return params, [Metric(k, v, ended, 0) for k, v in logged_metrics(record).items()], started, ended


def check_loggable(run_name: str, tags: dict[str, str], params: list, metrics: list, started: int, ended: int) -> None:
    """A UserError naming the first value MLflow never takes, by MLflow's own validation (mlflow.utils.validation: key
    characters and lengths, metric values and timestamps) and its stores' (UTF-8 text, 64-bit times)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_metric, _validate_param, _validate_tag

    for what, ms in (("start_time_ms", started), ("start_time_ms + duration_s", ended)):
        if not 0 <= ms < 2**63:
            raise UserError(f"{what} is {ms:.4g} ms: MLflow stores a time as epoch milliseconds in 0 .. 2^63-1; not logged")
    checks = [("run_name", run_name, lambda: None), *((f"tag {k[:60]!r}", k + v, functools.partial(_validate_tag, k, v))
                                                      for k, v in tags.items()),
              *((f"param {p.key[:60]!r}", p.key + p.value, functools.partial(_validate_param, p.key, p.value)) for p in params),
              *((f"metric {m.key[:60]!r}", m.key, functools.partial(_validate_metric, m.key, m.value, m.timestamp, m.step))
                for m in metrics)]
    for what, text, validate in checks:
        try:
            text.encode()  # a lone surrogate is no UTF-8: no store can hold it
            validate()
        except (MlflowException, UnicodeEncodeError) as exc:
            reason = exc.reason if isinstance(exc, UnicodeEncodeError) else " ".join(exc.message.split())[:160]
            raise UserError(f"{what}: MLflow never takes it ({reason}); not logged") from None


def job_times(record: dict) -> tuple[int, int]:
    """(start, end) of the job in epoch ms: MLflow's run shows the job's own duration, not the logging's."""
    started, duration = record.get("start_time_ms"), record.get("duration_s")
    if not _number(started):  # a record written before start_time_ms: its second-resolution timestamp
        try:
            started = datetime.strptime(record["started"], "%Y-%m-%dT%H:%M:%S%z").timestamp() * 1000
        except (KeyError, TypeError, ValueError):
            started = time.time() * 1000
    return int(started), int(started + (float(duration) * 1000 if _number(duration) and duration >= 0 else 0))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_status(record: dict) -> str:
    """MLflow's status follows the verdict: failed or error is FAILED, an interrupted job KILLED, else FINISHED (the
    verdict in words is the `verdict` tag); a case's point follows its expectation, as the sweep's exit code does: an
    expected failure that failed is FINISHED, an expected pass that failed or an expected failure that passed FAILED."""
    if record.get("interrupted"):
        return "KILLED"
    if record.get("expect") is not None and record.get("status") in ("passed", "failed"):
        return "FINISHED" if record.get("expectation_met") else "FAILED"
    return "FAILED" if record.get("status") in ("failed", "error") else "FINISHED"


def _logged(store: Store, run_id: str, record: dict, parent: str | None = None) -> dict:
    parent = parent or (record.get("sweep") or {}).get("parent_run_id")
    return {"status": "logged", "run_id": run_id, "uri": redact(store.uri), "experiment": store.experiment,
            "experiment_id": store.experiment_id, "parent_run_id": parent}


def _end(store: Store, run, status: str, reason: str, delete: bool = False) -> None:
    """A RUNNING run ended `status` with `huggy.end_reason` (a deleted one is restored for that, MLflow ends only active
    runs, then deleted again); `delete`: a partial copy, deleted (sync logs a whole one)."""
    run_id, deleted = run.info.run_id, run.info.lifecycle_stage == "deleted"
    if run.info.status == "RUNNING":
        if deleted:
            store.client.restore_run(run_id)
        store.client.set_tag(run_id, "huggy.end_reason", reason)
        store.client.set_terminated(run_id, status)
    if delete or deleted:
        store.client.delete_run(run_id)


def _parent_id(store: Store, sweep: dict | None) -> str | None:
    """The sweep's parent run in this store: sweep.json's if this store holds it, else one found by the sweep id or
    created after the fact (its store was down, or a sync into another store: no child points into another store)."""
    if not sweep:
        return None
    if _in_store(store, sweep.get("parent_run_id")):
        return sweep["parent_run_id"]
    with flock(Path(sweep["dir"])):  # two syncs of a sweep that started while the store was down: one parent
        sweep = read_sweep(Path(sweep["dir"])) or sweep
        if not _in_store(store, sweep.get("parent_run_id")):
            sweep = {**sweep, **_parent(store, sweep)}  # a parent after the fact, in this store
            write_sweep(Path(sweep["dir"]), sweep)
            store.client.set_terminated(sweep["parent_run_id"], "FINISHED")
    return sweep["parent_run_id"]


def _in_store(store: Store, run_id: str | None) -> bool:
    """Whether `run_id` is a run of this store's experiment (a parent id from sweep.json may be another store's)."""
    from mlflow.exceptions import MlflowException

    try:
        return bool(run_id) and store.client.get_run(run_id).info.experiment_id == store.experiment_id
    except MlflowException:
        return False


def run_tags(record: dict, parent: str | None, user: str | None = None) -> dict[str, str]:
    """A job's run tags; `mlflow.user` is the store's `tracking.user` (the config's, never a result.json's)."""
    model, sweep, env = (record.get(k) or {} for k in ("model", "sweep", "environment"))
    tags = {
        "mode": record["mode"], "device": record["device"], "dtype": record["dtype"], "status": record["status"],
        "verdict": verdict(record),  # status, for filters; verdict, for reading: the runs table's first column
        "reason": record.get("reason", ""), "synthetic": str(model.get("synthetic")).lower(),
        "model.sha256": str(model.get("sha256")), "huggy.job_id": record["job_id"], "mlflow.source.type": "LOCAL",
        "mlflow.note.content": escape(record.get("headline") or record.get("reason") or record["status"]),
        **{f"env.{k}": str(env[k]) for k in ENV_TAGS if k in env},
        **{f"host.{k}": str(v) for k, v in (record.get("host") or {}).items()},  # a launcher's placement (Ray)
        **_source_tags(user),
    }
    if record.get("overrides") is not None:
        tags["overrides"] = " ".join(record["overrides"])
    metrics = record.get("metrics") or {}
    best = fastest_backend(metrics, timed_batch(metrics, record.get("batch_size"))[0])  # benchmark: named with the dtype
    ran = best and ran_dtype(best, record["dtype"])  # it ran where that is not the point's (onnxruntime's fp32 graph)
    optional = {"best_backend": best and (best if ran == record["dtype"] else f"{best} ({ran})"),
                "case": record.get("case"), "emulated": record.get("emulated") and "true", "sweep_id": sweep.get("id"),
                "job_num": str(sweep.get("num")) if sweep else None, "mlflow.parentRunId": parent}
    tags.update({k: v for k, v in optional.items() if v})
    # a task's own tags, under the tool's: the system tags (mlflow.*, huggy.*) and the verdict come from the tool only
    own = {k: v for k, v in (record.get("tags") or {}).items() if not str(k).startswith(("mlflow.", "huggy."))}
    return {k: str(v)[:MAX_TAG_CHARS] for k, v in {**own, **tags}.items()}


def _source_tags(user: str | None) -> dict[str, str]:
    """What a job's run and a sweep's parent both say of where they come from: run.py, the process, user and commit."""
    tags = {"mlflow.source.name": "run.py", "huggy.owner": owner(), "mlflow.user": user,
            "mlflow.source.git.commit": git_commit()}
    return {k: v for k, v in tags.items() if v}


def limit_params(record: dict) -> dict[str, str]:
    """The limits this point was judged by, under keys every dtype shares (`limit/max_abs`, `limit/cosine_min`, ...),
    so a compare view lines them up; the effective ones (after `specialize`) where the job reported them."""
    limits = judged_limits(record)
    if record.get("layer_threshold") is not None:
        limits.setdefault("layer_rel_rmse", record["layer_threshold"])
    return {f"limit/{k}": str(v) for k, v in limits.items() if v is not None}


def _per_dtype(key: str, dtype: str) -> bool:
    """`verify.limits.bf16.cosine_min`: a per-dtype key, replaced by its `limit/...`
    twin (one row for every dtype: a compare of fp32 and bf16 runs has no half-empty rows)."""
    parts = key.split(".")
    return any(part == dtype and parts[i - 1] == "limits" for i, part in enumerate(parts[:-1]) if i)


def verdict(record: dict) -> str:
    """The verdict as the runs table's first column shows it: `passed`, `passed, noisy` (its p50), `skipped: <why>`; a case's
    point says whether it met its expected verdict: `failed as expected: <why>`, `passed, expected failed`."""
    status, reason, expect = record["status"], record.get("reason"), record.get("expect")
    if expect is not None:
        status += " as expected" if record.get("expectation_met") else f", expected {expect}"
    if record["status"] != "passed" and reason:
        return f"{status}: {reason}"
    return f"{status}, noisy" if noisy(record) else status  # its p50: `passed, p50 noisy` was cut in 112 px


def artifacts(record: dict, workdir: Path, inside_only: bool = True) -> list[Path]:
    """The job's regular files to upload beside its result.json: report.html, arrays, tables, files, .hydra/config.yaml.
    `inside_only` (sync): only files inside the job's folder, symlinks resolved (a result.json naming `/etc/passwd` or
    `../x` uploads nothing of it); the job itself also uploads a file it wrote elsewhere (export-onnx's mode.path)."""
    names = ["report.html", *(record.get("arrays") or {}).values(), *(record.get("tables") or {}).values(),
             *(record.get("files") or [])]
    paths = [p if p.is_absolute() else workdir / p for p in map(Path, filter(lambda n: isinstance(n, str), names))]
    home = workdir.resolve()
    return [p for p in dict.fromkeys([*paths, workdir / ".hydra" / "config.yaml"])
            if p.is_file() and (not inside_only or p.resolve().is_relative_to(home))]


# --- who owns a RUNNING run: sync closes it only once its owner is gone


def owner() -> str:
    """`<host>:<boot id>:<pid>:<start time>` of this process: sync ends a RUNNING run whose owner is gone."""
    return f"{platform.node()}:{_boot_id()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(tag: str) -> bool | None:
    """Whether the process named by an owner tag still runs; None when it ran on another host (it cannot be told)."""
    try:
        host, boot, pid, start = tag.rsplit(":", 3)
    except ValueError:
        return None
    if host != platform.node():
        return None
    now = _start_time(int(pid)) if pid.isdigit() else "gone"
    return boot == _boot_id() and now != "gone" and start == now


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "?"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (with the pid, it names one process), or `gone`."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "gone"


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's commit, asked once per process (a sweep's points share it)."""
    if not (REPO / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# --- a sweep: a parent run created before any job, its id in <sweep dir>/sweep.json


def read_sweep(sweep_dir: Path) -> dict | None:
    try:
        return json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_sweep(sweep_dir: Path, info: dict) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(sweep_dir / SWEEP_FILE, json.dumps(info, indent=2) + "\n")


def mark_sweep_down(sweep_dir: Path, reason: str) -> None:
    """The first point that finds the store down says so once; the sweep's later points do not wait again."""
    info = read_sweep(sweep_dir)
    if info is not None and info.get("tracking", {}).get("status") != "down":
        write_sweep(sweep_dir, {**info, "tracking": {"status": "down", "reason": reason}})


def start_sweep(settings: dict, sweep_dir: Path, sweep_id: str, argv: list[str], jobs: int | None = None) -> dict:
    """Create the experiment and the parent run before the jobs start (parallel jobs then only add children)."""
    info = {"id": sweep_id, "dir": str(sweep_dir), "argv": [redact(a) for a in argv], "started": time.time(), "jobs": jobs,
            "parent_run_id": None, "tracking": {"status": "off"}}
    if settings.get("enabled", True):
        try:
            store = Store.open(settings)
            with store_lock(store.uri):
                info.update(_parent(store, info))
        except Exception as exc:
            info["tracking"] = {"status": "down", "reason": _explain(store_uri(settings.get("uri")), exc)}
    write_sweep(sweep_dir, info)
    return info


SWEEP_FUNCTIONS = ("glob(", "range(", "choice(", "interval(", "tag(", "sort(", "shuffle(")


def sweep_overrides(argv: list[str]) -> dict[str, str]:
    """The command line's `key=value` overrides that describe the sweep (not Hydra's or tracking's plumbing)."""
    pairs = (arg.lstrip("+~").partition("=") for arg in argv)
    return {key: value for key, eq, value in pairs if eq and not key.startswith(("hydra", "tracking.", "-"))}


def sweep_name(argv: list[str], started: float) -> str:
    """`sweep mode=precision dtype=fp32,fp16,bf16 · 12-01 07:45`: what was swept (and the mode), and when."""
    overrides = sweep_overrides(argv)
    shown = {k: v for k, v in overrides.items() if k == "mode" or "," in v or v.startswith(SWEEP_FUNCTIONS)} or overrides
    what = " ".join(f"{k}={v}" for k, v in shown.items()) or "(defaults)"
    what = what if len(what) <= 110 else what[:109] + "…"
    return f"sweep {what} · {time.strftime('%m-%d %H:%M', time.localtime(started))}"


def _parent(store: Store, info: dict) -> dict:
    """The sweep's parent run, found by its sweep id, else created (named after what was swept, with the overrides as
    params: a swept key holds its list of values), as sweep.json records it."""
    from mlflow.entities import Param

    found = store.runs(f"tags.`sweep_id` = '{info['id']}' and tags.`{PARENT_TAG}` = 'true'", 10)
    if found:
        run_id = found[0].info.run_id
    else:
        argv = info.get("argv", [])
        shown = redact(" ".join(argv))
        tags = {"sweep_id": info["id"], PARENT_TAG: "true", "huggy.jobs": str(info.get("jobs") or ""),
                SWEEP_DIR_TAG: str(info.get("dir") or ""), "overrides": shown,
                "mlflow.note.content": f"python run.py {escape(shown)}", **_source_tags(store.user)}
        name = redact(sweep_name(argv, info.get("started") or time.time()))
        run_id = store.client.create_run(store.experiment_id, run_name=name, tags=tags).info.run_id
        params = [Param(k, redact(v)[:MAX_PARAM_CHARS]) for k, v in sweep_overrides(argv).items()]
        store.client.log_batch(run_id, params=params)  # none: MLflow's client does nothing
    url = run_url(store.uri, store.experiment_id, run_id)
    return {"parent_run_id": run_id, "tracking": {"status": "logged", "uri": redact(store.uri),
                                                   "experiment_id": store.experiment_id, "url": url}}


def recommendation(comparison: dict) -> str:
    """The sweep's recommendation in one line, per device and batch size (compare.recommend):
    `cpu at batch 64: bf16 eager (p50 562 µs; passing fp32, bf16)`, or `cpu at batch 64: no pick (why)`."""
    parts = []
    for where, rec in (comparison.get("recommended") or {}).items():
        if rec.get("dtype"):
            figure = f"p50 {fmt(rec['p50_us'])} µs" + (" NOISY: re-measure before relying on it" if rec.get("noisy") else "")
            pick = rec["dtype"] + (f" {rec['backend']}" if rec.get("backend") else "")
            parts.append(f"{where}: {pick} ({figure}; passing {', '.join(rec.get('passing') or [rec['dtype']])})")
        else:
            parts.append(f"{where}: no pick ({rec.get('why', 'no passing dtype')})")
    return "; ".join(parts)


def own_answer(comparison: dict) -> str:
    """What a sweep's record, replay and LoadGen points found (compare.port_lines, loadgen_lines), in one line: the
    parent's verdict where no dtype is recommended, beside the recommendation where one is."""
    return "; ".join(line for line in comparison.get("lines", []) if line.startswith(OWN_ANSWERS))


def end_sweep(settings: dict, sweep_dir: Path, summary: dict, files: list[Path], status: str = "FINISHED") -> dict | None:
    """Close the parent run with the sweep's tally, recommendation, comparison and files and save the UI view of its
    runs; returns its UI addresses {"parent": ..., "runs": ...} (run_url), or None if not logged."""
    info = read_sweep(sweep_dir)
    if not info or not info.get("parent_run_id") or info.get("tracking", {}).get("status") == "down":
        return None
    try:
        store = Store.open(settings)
        with store_lock(store.uri):
            from mlflow.entities import Metric, RunTag

            run_id, stamp = info["parent_run_id"], int(time.time() * 1000)
            comparison = summary.get("comparison") or {}
            advice, found = recommendation(comparison), own_answer(comparison)
            head = escape(summary.get("line", "")) + "".join(  # in view: the one-line answer, before "Show more"
                f" · **{word}** {escape(text)}" for word, text in (("Recommended", advice), ("Found", found)) if text)
            note = "\n\n".join(filter(None, [head, "\n".join(f"- {escape(x)}" for x in comparison.get("lines", []))]))
            verdict = "; ".join(filter(None, [advice and f"recommends {advice}", found]))
            tags = {"mlflow.note.content": note, "recommendation": advice, "verdict": verdict}
            tally = [Metric(f"jobs_{k}", float(v), stamp, 0) for k, v in summary.get("tally", {}).items()]
            tags = [RunTag(k, v[:MAX_TAG_CHARS]) for k, v in tags.items() if v]
            store.client.log_batch(run_id, metrics=tally, tags=tags)
            if rows := comparison.get("table"):  # as the column dict log_table takes (shown in the UI's artifact view)
                columns = {n: [r.get(n) for r in rows] for n in dict.fromkeys(k for r in rows for k in r)}
                store.client.log_table(run_id, data=columns, artifact_file="comparison_table.json")
            for path in filter(Path.is_file, files):
                if path.suffix == ".md":
                    _log_markdown(store, run_id, path, int(settings.get("ui_port") or 5000))
                else:
                    store.client.log_artifact(run_id, str(path))
            store.client.set_terminated(run_id, status)
            children = store.children(run_id)
            view = sweep_view(info["id"], *present_columns(children), [c.info.run_name for c in children],
                              [c.data.tags.get("verdict", "") for c in children])
            store.client.set_experiment_tag(store.experiment_id, SHARED_VIEW + info["id"], view)
            info["ui"] = {"parent": run_url(store.uri, store.experiment_id, run_id),
                          "runs": run_url(store.uri, store.experiment_id, view=info["id"])}
            store.client.set_experiment_tag(store.experiment_id, "mlflow.note.content", sweep_list(store))
            write_sweep(sweep_dir, info)
            return info["ui"]
    except Exception:  # the summary files are on disk; sync re-closes nothing, so say so in the caller
        return None


SWEEPS_LISTED = 3
DESCRIPTION_CHARS = 105  # the text MLflow's collapsed description box shows on its one line at 1600 px


def sweep_list(store: Store) -> str:
    """The experiment's description: its last few finished sweeps, newest first, each a link to its runs (no "latest":
    MLflow shows it above every view of the experiment, another sweep's included)."""
    parents = store.sweeps(SWEEPS_LISTED, also=" and attributes.status != 'RUNNING'")
    return one_line("Sweeps, newest first: ", [(p.info.run_name, run_url(store.uri, store.experiment_id, view=p.data.tags["sweep_id"]))
                                                for p in parents if p.data.tags.get("sweep_id")])


LINK = " (runs)"  # each name's link: the name itself stays plain text


def one_line(head: str, links: list[tuple[str, str]], chars: int = DESCRIPTION_CHARS) -> str:
    """`head` and as many (text, url) links as fit one line of `chars` visible characters, the first always (cut with
    "…" if it alone is longer): a second line shows cut in half in MLflow's collapsed box. Each name is plain text
    before its `(runs)` link: MLflow's home page lists the description unrendered (`sweep x`, not `[sweep x](#/…`)."""
    room, shown = chars - len(head), []
    for text, url in links:
        if shown and len(text) + len(LINK) + 3 > room:
            break
        text = text if len(text) + len(LINK) <= room else text[:max(room - len(LINK) - 1, 8)] + "…"
        shown.append(f"{escape(text)} ([{LINK.strip(' ()')}]({url}))")
        room -= len(text) + len(LINK) + 3
    return head + " · ".join(shown)


def _log_markdown(store: Store, run_id: str, path: Path, ui_port: int) -> None:
    """A markdown artifact whose relative image links point at the run's own artifacts: MLflow's viewer draws only
    images with an absolute address (a relative one is shown as its link text, a data: URI is dropped). The UI's
    address: the server itself, or where mode=ui serves a SQLite store (tracking.ui_port)."""
    server = urlparse(store.uri).scheme in ("http", "https")
    base = redact(store.uri).rstrip("/") if server else f"http://127.0.0.1:{ui_port}"
    link = r"!\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:)([^)\s]+)\)"  # an image address with a scheme (http:, data:) stays
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        copy.write_text(re.sub(link, lambda m: f"![{m[1]}]({base}/get-artifact?path={m[2]}&run_uuid={run_id})",
                               path.read_text()))
        store.client.log_artifact(run_id, str(copy))


def sweep_runs(settings: dict, sweep_id: str | None = None) -> dict:
    """A sweep in a store (the latest, or `sweep_id`) as the UI should show it, for scripts/ui_check.py."""
    store = Store.open(settings)
    parents = store.sweeps(1, also=f" and tags.sweep_id = '{sweep_id}'" if sweep_id else "")
    if not parents:
        raise StoreDown(f"no sweep {sweep_id or ''} in {redact(store.uri)} (experiment {store.experiment!r})".replace("  ", " "))
    parent, tags = parents[0].info, parents[0].data.tags
    children, folder = store.children(parent.run_id), tags.get(SWEEP_DIR_TAG)
    return {"sweep_id": tags["sweep_id"], "experiment_id": store.experiment_id, "experiment": store.experiment,
            "uri": redact(store.uri), "runs": run_url(store.uri, store.experiment_id, view=tags["sweep_id"]),
            "report": str(Path(folder) / "report.html") if folder else None,
            "columns": view_columns(*present_columns(children)),
            "parent": {"id": parent.run_id, "name": parent.run_name, "recommendation": tags.get("recommendation", ""),
                       "tally": tags.get("mlflow.note.content", "").split("\n")[0].split(" · ")[0],
                       "artifacts": [a.path for a in store.client.list_artifacts(parent.run_id)]},
            "children": [{"id": c.info.run_id, "name": c.info.run_name, "metrics": dict(c.data.metrics),
                          "params": dict(c.data.params), "status": c.data.tags.get("status", ""),
                          "reason": c.data.tags.get("reason", ""), "verdict": c.data.tags.get("verdict", ""),
                          "headline": [k for k in c.data.metrics if k.startswith((ANSWER, "best/"))]} for c in children]}


def latest_sweep_url(settings: dict) -> str | None:
    """The runs view of the store's latest finished sweep (run_url); None when the store has no sweep yet."""
    store = Store.open(settings)
    views = store.client.get_experiment(store.experiment_id).tags or {}
    ids = [parent.data.tags.get("sweep_id") for parent in store.sweeps(20)]
    return next((run_url(store.uri, store.experiment_id, view=i) for i in ids if SHARED_VIEW + str(i) in views), None)


# --- sync: every pending result.json, exactly once


RECORD_KEYS = ("job_id", "mode", "run_name", "status", "device", "dtype")  # what logging a result reads
# the other fields logging reads, with their JSON types (absent or null is fine)
RECORD_FIELDS = {"metrics": dict, "series": dict, "params": dict, "tags": dict, "arrays": dict, "tables": dict,
                 "files": list, "sweep": dict, "tracking": dict, "model": dict, "environment": dict, "host": dict,
                 "reason": str, "headline": str, "case": str, "overrides": list}


def read_record(path: Path) -> tuple[dict, str | None]:
    """A foreign result.json read under foreign.read_json's caps, then checked field by field, and its tracking status;
    a UserError naming the file and the first bad field, never a traceback, a hang or a retry that cannot succeed."""
    record = read_json(path, "sync: result")
    if not isinstance(record, dict):
        raise UserError(f"sync: result {path} is a JSON {type(record).__name__}, not a job's result")
    tracking = record.get("tracking")
    state = tracking.get("status") if isinstance(tracking, dict) else None
    if state not in ("pending", "logging"):
        return record, state  # not for sync: only what logging reads must be well formed
    missing = [k for k in RECORD_KEYS if not isinstance(record.get(k), str) or not record[k]]
    if missing:
        raise UserError(f"sync: result {path} has no text {', '.join(missing)}: not a job's result.json")
    wrong = [f"{k} is a {type(record[k]).__name__}, not a {kind.__name__}" for k, kind in RECORD_FIELDS.items()
             if record.get(k) is not None and not isinstance(record[k], kind)]
    if record["status"] not in VERDICTS:
        wrong.insert(0, f"status {record['status'][:40]!r} is none of {', '.join(VERDICTS)}")
    sweep = record.get("sweep")
    if isinstance(sweep, dict) and not all(isinstance(sweep.get(k), str) for k in ("id", "dir")):
        wrong.append("sweep has no text id and dir")
    series = record.get("series")
    if isinstance(series, dict) and not all(isinstance(points, list) and all(isinstance(p, list) and len(p) == 2 for p in points)
                                            for points in series.values()):
        wrong.append("series is not lists of [step, value] pairs")
    if wrong:
        raise UserError(f"sync: result {path}: {wrong[0]}; not logged")
    return record, state


def sync(settings: dict, roots: list[Path], say=print) -> dict[str, int]:
    """Log every pending result.json (a missing folder or a file that is not a result is named and skipped), then end
    every RUNNING run whose process is gone; returns the counts."""
    counts = {"logged": 0, "pending": 0, "seen": 0, "skipped": 0, "closed": 0}

    def skip(what: Path, why: str) -> None:
        counts["skipped"] += 1
        say(f"sync: skipped {what}: {why}")

    for root in roots:
        if not root.is_dir():
            skip(root, f"{'not a folder' if root.exists() else 'no such folder'} (mode.paths)")
    found = sorted({p for root in roots if root.is_dir() for p in root.rglob("result.json")})
    said = None
    for path in found:
        try:
            state = read_record(path)[1]
        except UserError as exc:
            skip(path, " ".join(str(exc).split())[:240])
            continue
        if state not in ("pending", "logging"):  # logging: a crash mid-copy
            continue
        try:
            outcome = log_job({**settings, "enabled": True}, path.parent, retry_down=True, foreign=True)
            update_result(path.parent, tracking=outcome)
        except (OSError, ValueError, KeyError, TypeError, UserError) as exc:  # a result.json of the wrong shape: name it, go on
            skip(path, disk_full_message(exc) if is_disk_full(exc) else str(exc) if isinstance(exc, UserError)
                 else f"{type(exc).__name__}: {exc}")
            continue
        counts["seen"] += 1
        counts["logged" if outcome["status"] == "logged" else "pending"] += 1
        if outcome["status"] != "logged" and outcome.get("reason") != said:  # the store down: said once, not per file
            said = outcome.get("reason")
            say(f"sync: {path} stays pending: {said}")
    with contextlib.suppress(StoreDown):  # the pending count says the store is down
        store = Store.open({**settings, "enabled": True})
        with store_lock(store.uri):
            counts["closed"] = close_orphans(store, say)
    return counts


def close_orphans(store: Store, say) -> int:
    """End every RUNNING run of the experiment whose owner process is gone: a job's partial copy FAILED (and deleted),
    a sweep's parent FINISHED when all its jobs are in, else KILLED, each with `huggy.end_reason`."""
    from mlflow.entities import ViewType

    closed = 0
    for run in store.runs("attributes.status = 'RUNNING'", run_view_type=ViewType.ALL):
        tags = run.data.tags
        tag = tags.get("huggy.owner")
        if tag is None or owner_alive(tag) is not False:  # not ours, alive, or on another host: left as it is
            continue
        pid = tag.rsplit(":", 3)[2]
        if tags.get(PARENT_TAG) == "true":
            done = len(store.children(run.info.run_id, also=" and tags.`huggy.complete` = 'true'"))
            jobs = int(tags.get("huggy.jobs") or 0)
            status = "FINISHED" if jobs and done >= jobs else "KILLED"
            reason = (f"the sweep's process (pid {pid}) ended without closing it; {done} of {jobs or '?'} jobs are in "
                      "MLflow" + ("" if status == "FINISHED" else ": the sweep did not complete"))
        elif tags.get("huggy.complete") == "true":  # the copy was whole; only its closing was lost
            status = run_status({"status": tags.get("status")})
            reason = f"its job's process (pid {pid}) ended after the copy was complete, before closing it"
        else:
            status, reason = "FAILED", f"its job's process (pid {pid}) ended while logging it: a partial copy"
        _end(store, run, status, reason, delete=reason.endswith("a partial copy"))
        say(f"sync: run {run.info.run_id} ({run.info.run_name}) was RUNNING with no live process: ended {status} ({reason})")
        closed += 1
    return closed
