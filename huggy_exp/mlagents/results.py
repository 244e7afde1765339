"""ML-Agents results folders: checkpoints on disk, run_logs/training_status.json, configuration.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents.weights import PolicyWeights, sha256_file
from huggy_exp.foreign import MAX_JSON_BYTES, read_capped


def step_from_name(path: Path) -> int | None:
    m = re.search(r"-(\d+)\.(pt|onnx)$", path.name)
    return int(m.group(1)) if m else None


def sibling_onnx(pt: Path) -> Path | None:
    candidate = pt.with_suffix(".onnx")
    return candidate if candidate.is_file() else None


def list_checkpoints(results_dir: str | Path) -> list[dict]:
    """Every checkpoint of an ML-Agents results folder: files on disk joined with run_logs/training_status.json (or a
    bare copy of the run logs: training_status.json at the top, its files then not present)."""
    root = Path(results_dir).expanduser()
    if not root.is_dir():
        raise UserError(f"results folder not found: {root}")
    status_file = next((p for p in (root / "run_logs" / "training_status.json", root / "training_status.json") if p.is_file()), None)
    status = read_training_status(status_file) if status_file is not None else {}
    rows: dict[tuple[str, int], dict] = {}
    for behavior_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "run_logs"):
        for f in sorted(behavior_dir.iterdir()):
            step = step_from_name(f)
            if step is None or not f.name.startswith(behavior_dir.name + "-"):
                continue
            row = rows.setdefault((behavior_dir.name, step), _row(behavior_dir.name, step))
            row["files"][f.suffix[1:]] = {"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)}
    for behavior, info in status.items():
        for ck in info["checkpoints"]:
            row = rows.setdefault((behavior, ck["steps"]), _row(behavior, ck["steps"]))
            row.update({k: ck[k] for k in ("reward_nonfinite",) if k in ck}, reward=ck.get("reward"),
                       creation_time=ck.get("creation_time"), final=row["final"] or ck["steps"] == info["final"],
                       logged_files=[ck.get("file_path"), *ck.get("auxillary_file_paths", [])])
    return [{**r, "present": bool(r["files"])} for r in sorted(rows.values(), key=lambda r: (r["behavior"], r["step"]))]


def _parse_text(path: Path, parse, kind: str, error: type, utf8_hint: str = ""):
    """`parse` of a UTF-8 text file; unreadable, not UTF-8 or not valid `kind` is one line naming the file."""
    try:
        return parse(read_capped(path, MAX_JSON_BYTES, "ML-Agents file").decode("utf-8"))  # a FIFO or a 2 GB file: one line
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (bad byte at offset {exc.start}){utf8_hint}") from None
    except (error, RecursionError) as exc:
        raise UserError(f"{path} is not valid {kind}: {(str(exc).strip() or 'nested too deeply').splitlines()[0]}") from None
    except OSError as exc:
        raise UserError(f"{path} cannot be read: {exc.strerror or exc}") from None


def read_training_status(path: Path) -> dict[str, dict]:
    """ML-Agents' run_logs/training_status.json, checked: {behavior: {"checkpoints": [entry, ...], "final": steps or
    None}}; "metadata" and behaviors without a "checkpoints" list (ML-Agents also records lessons and ELO) skipped."""
    doc = _parse_text(path, json.loads, "JSON", json.JSONDecodeError, "; ML-Agents writes it as UTF-8 JSON")
    if not isinstance(doc, dict):
        raise UserError(f"{path}: top level is a JSON {_json_kind(doc)}, expected an object of behaviors "
                        '({"<Behavior>": {"checkpoints": [...]}, "metadata": {...}})')
    out = {}
    for behavior, info in doc.items():
        if behavior == "metadata":
            continue
        if not isinstance(info, dict):
            raise _bad_status(path, behavior, info, 'an object with "checkpoints"')
        if "checkpoints" not in info:
            continue
        if not isinstance(info["checkpoints"], list):
            raise _bad_status(path, f"{behavior}.checkpoints", info["checkpoints"], "a list of checkpoint entries")
        entries = [_status_entry(path, f"{behavior}.checkpoints[{i}]", ck) for i, ck in enumerate(info["checkpoints"])]
        final = info.get("final_checkpoint")
        final = None if final is None else _status_entry(path, f"{behavior}.final_checkpoint", final)["steps"]
        out[behavior] = {"checkpoints": entries, "final": final}
    return out


def _json_kind(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _bad_status(path: Path, where: str, value: object, expected: str) -> UserError:
    shown = f"a JSON {_json_kind(value)}" if isinstance(value, (dict, list)) else json.dumps(value)[:60]
    return UserError(f"{path}: {where} is {shown}, expected {expected}")


def _status_entry(path: Path, where: str, ck: object) -> dict:
    """One checkpoint entry of training_status.json: integer steps, numeric or null reward, string paths."""
    if not isinstance(ck, dict):
        raise _bad_status(path, where, ck, 'an object with "steps"')
    if "steps" not in ck:
        raise UserError(f'{path}: {where} has no "steps" (keys: {", ".join(map(str, ck)) or "none"})')
    steps = ck["steps"]
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not np.isfinite(steps) or steps < 0 or steps != int(steps):
        raise _bad_status(path, f"{where}.steps", steps, "a non-negative integer")
    number = lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))  # noqa: E731
    for key in ("reward", "creation_time"):
        if not number(ck.get(key)):
            raise _bad_status(path, f"{where}.{key}", ck[key], "a number or null")
    if ck.get("creation_time") is not None and not np.isfinite(ck["creation_time"]):
        raise _bad_status(path, f"{where}.creation_time", ck["creation_time"], "a finite number or null")
    if ck.get("reward") is not None and not np.isfinite(ck["reward"]):  # JSON has no NaN; Python's json writes it anyway
        ck = {**ck, "reward": None, "reward_nonfinite": json.dumps(ck["reward"])}  # "NaN", "Infinity", "-Infinity"
    if not (ck.get("file_path") is None or isinstance(ck["file_path"], str)):
        raise _bad_status(path, f"{where}.file_path", ck["file_path"], "a string")
    aux = ck.get("auxillary_file_paths", [])
    if not isinstance(aux, list) or not all(isinstance(a, str) for a in aux):
        raise _bad_status(path, f"{where}.auxillary_file_paths", aux, "a list of strings")
    return {**ck, "steps": int(steps), "auxillary_file_paths": aux}


def read_configuration(root: Path) -> dict[str, dict]:
    """Per behavior, the trainer and network settings of an ML-Agents configuration.yaml ({} when absent)."""
    import yaml

    path = Path(root) / "configuration.yaml"
    if not path.is_file():
        return {}
    doc = _parse_text(path, yaml.safe_load, "YAML", yaml.YAMLError) or {}
    behaviors = doc.get("behaviors") or {} if isinstance(doc, dict) else doc
    if not isinstance(behaviors, dict):
        found = f"{'behaviors: ' if isinstance(doc, dict) else ''}a {type(behaviors).__name__}"
        raise UserError(f"{path}: expected a mapping 'behaviors: {{<Behavior>: {{trainer_type: ..., network_settings: "
                        f"{{...}}}}}}', found {found}")
    out = {}
    for behavior, settings in behaviors.items():
        settings = settings or {}
        net = settings.get("network_settings") or {} if isinstance(settings, dict) else {}
        if not isinstance(settings, dict) or not isinstance(net, dict):
            where, bad = (f"behaviors.{behavior}", settings) if not isinstance(settings, dict) else (f"behaviors.{behavior}.network_settings", net)
            raise UserError(f"{path}: {where} is a {type(bad).__name__}, expected a mapping")
        out[str(behavior)] = {k: (settings if k in ("trainer_type", "max_steps") else net).get(k)
                              for k in ("trainer_type", "hidden_units", "num_layers", "normalize", "max_steps")}
    return out


def configuration_mismatches(config: dict, w: PolicyWeights) -> list[str]:
    """Where a behavior's configuration.yaml disagrees with the sizes read from the weights."""
    found = {"hidden_units": w.hidden_units, "num_layers": w.num_layers, "normalize": w.normalizer is not None}
    return [f"{k}: configuration.yaml says {config[k]}, weights have {v}" for k, v in found.items()
            if config.get(k) is not None and config[k] != v]


def _row(behavior: str, step: int) -> dict:
    return {"behavior": behavior, "step": step, "reward": None, "creation_time": None, "files": {}, "logged_files": [], "final": False}


def latest_checkpoint(results_dir: Path, behavior: str | None = None, step: int | None = None) -> Path:
    """The .pt (else .onnx) of the chosen step, or of the newest one present."""
    rows = [r for r in list_checkpoints(results_dir) if r["present"] and (behavior is None or r["behavior"] == behavior)
            and (step is None or r["step"] == step)]
    if not rows:
        want = f" for behavior {behavior}" if behavior else ""
        want += f" at step {step}" if step is not None else ""
        raise UserError(f"results folder {results_dir} has no checkpoint files{want}")
    files = rows[-1]["files"]
    return Path((files.get("pt") or files["onnx"])["path"])


def results_model(results_dir: Path, behavior: str | None = None, step: int | None = None) -> Path:
    """The model file a results folder offers: the behavior's checkpoint (newest, or at `step`), else its final
    <Behavior>.onnx. An unknown behavior, or several behaviors and none chosen, is an error naming the behaviors found."""
    root = Path(results_dir).expanduser()
    rows = list_checkpoints(root)
    finals = {p.stem: p for p in sorted(root.glob("*.onnx")) if p.is_file()}
    found = sorted({r["behavior"] for r in rows} | set(finals))
    with_files = sorted({r["behavior"] for r in rows if r["present"]} | set(finals))
    if behavior is not None and str(behavior) not in found:
        raise UserError(f"results folder {root} has no behavior {behavior!r}; behaviors found: {', '.join(found) or 'none'}")
    if behavior is None and len(with_files) > 1:
        raise UserError(f"results folder {root} holds several behaviors ({', '.join(with_files)}); choose one with model.behavior=<name>")
    behavior = None if behavior is None else str(behavior)
    try:
        return latest_checkpoint(root, behavior, step)
    except UserError:
        final = finals.get(behavior) if behavior else next(iter(finals.values()), None)
        if final is None or step is not None:
            raise
        return final


def run_folder(model_file: Path) -> Path:
    """The results folder around a model file: <run>/<Behavior>.onnx or <run>/<Behavior>/<Behavior>-<step>.pt."""
    for folder in (model_file.parent, model_file.parent.parent):
        if (folder / "run_logs").is_dir() or (folder / "configuration.yaml").is_file():
            return folder
    return model_file.parent


def model_files(model_file: str | Path) -> list[Path]:
    """What belongs with a model file and is read beside it: its results folder (when it sits in one, the model given
    as the folder's final <Behavior>.onnx too), the behaviour's final <Behavior>.onnx beside the checkpoint's folder and
    its checkpoints' folder beside a final .onnx, and the checkpoint's own .onnx. No output replaces these."""
    path = Path(model_file).expanduser().absolute()
    folder = run_folder(path)
    results = folder != path.parent or (folder / "run_logs").is_dir() or (folder / "configuration.yaml").is_file()
    return [*([folder] if results else []), path.parent.parent / f"{path.parent.name}.onnx", path.with_suffix(".onnx"),
            path.with_suffix("")]


def model_configuration(model_file: Path) -> tuple[str, dict | None]:
    """(behavior, its configuration.yaml settings or None) for a model file inside a results folder."""
    path = Path(model_file).resolve()
    behavior = path.parent.name if step_from_name(path) is not None else path.stem
    return behavior, read_configuration(run_folder(path)).get(behavior)
