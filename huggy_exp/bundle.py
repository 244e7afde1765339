"""A port-certificate bundle: what a policy did on one host, as data only (JSON and .npz), checked file by file.

Layout (format version 3):
    manifest.json                 format, model (weights sha256, file sha256, dims), observations (preset, seed, rows),
                                  points {key: device, dtype, backend, batch, threads, environment, fingerprints
                                  (verify.fingerprints: fingerprint, quantized_fingerprint, ...), decimals,
                                  latency summary, judged {dtype, row, limits: verify.Limits as recorded}, files},
                                  files {relative path: {sha256, bytes}} of every other file
    inputs.npz                    the feeds every point ran (obs_0.., action_masks), float32
    reference_fp64.npz            the CPU fp64 eager outputs on those inputs, and their DISTRIBUTIONS
    points/<slug>/outputs.npz     the point's deterministic outputs, and their DISTRIBUTIONS where its runner gives them
    points/<slug>/latency.npz     `seconds`: every timed call, in order
    points/<slug>/comparison.json the point against the fp64 reference

Points are keyed `device/dtype/backend/b<batch>` (`npu:0/bf16/eager/b64`). Jobs of a parallel sweep write their own
point files, then merge the manifest under an exclusive lock (`.lock`, the one file the manifest does not list).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents import sha256_file
from huggy_exp import terminal
from huggy_exp.mlagents.weights import weights_sha256  # noqa: F401 (the bundle's model identity)
from huggy_exp.results import jsonable
from huggy_exp.files import atomic_write, check_unused, flock
from huggy_exp.foreign import MAX_LATENCY_SAMPLES, check_npz, read_json

FORMAT = "huggy_exp-port-bundle"
VERSION = 3  # 3: DISTRIBUTIONS and `judged` (mode=rejudge); 2: a point's `fingerprints` are verify.fingerprints'
READS = (2, 3)
DISTRIBUTIONS = ("mu", "log_sigma", "masked_logits")  # what the outputs are drawn from: KL, |Δμ|/σ, discrete margins
MANIFEST = "manifest.json"
LOCK = ".lock"
INPUTS = "inputs.npz"
REFERENCE = "reference_fp64.npz"


# --- keys


def point_key(device: str, dtype: str, backend: str, batch: int) -> str:
    return f"{device}/{dtype}/{backend}/b{int(batch)}"


def slug(key: str) -> str:
    """A folder name for a point key: `npu:0/bf16/eager/b64` -> `npu0-bf16-eager-b64`."""
    return key.replace(":", "").replace("/", "-")


def arrays_sha256(arrays: dict[str, np.ndarray]) -> str:
    """One digest of named arrays (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


# --- writing


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    plain = {k: np.asarray(v) for k, v in arrays.items()}
    bad = [k for k, v in plain.items() if v.dtype.kind not in "biuf"]
    if bad:
        raise UserError(f"bundle arrays must be numeric (no objects, no pickle): {bad[0]} is {plain[bad[0]].dtype}")
    np.savez(buffer, **plain)
    return buffer.getvalue()


def json_bytes(value) -> bytes:
    return (json.dumps(jsonable(value), indent=2) + "\n").encode()


def record_point(root: Path, model: dict, observations: dict, inputs: dict[str, np.ndarray],
                 reference: dict[str, np.ndarray], key: str, point: dict, outputs: dict[str, np.ndarray],
                 latency_s: np.ndarray, comparison: dict) -> tuple[dict, bool]:
    """Add (or replace) one point; the first point writes the inputs and the fp64 reference. A bundle of another model,
    or of other inputs, is refused: one bundle certifies one policy on one set of inputs. Returns the manifest written
    and whether an earlier recording of the key was replaced."""
    root = Path(root)
    folder = f"points/{slug(key)}"
    files = {f"{folder}/outputs.npz": npz_bytes(outputs), f"{folder}/comparison.json": json_bytes(comparison),
             f"{folder}/latency.npz": npz_bytes({"seconds": np.asarray(latency_s, np.float64)})}
    check_out(root)
    root.mkdir(parents=True, exist_ok=True)
    with flock(root / LOCK, create=True):  # one manifest merge at a time
        for orphan in leftovers(root):  # an interrupted or killed record's files, never listed: the bundle would refuse them
            orphan.unlink()
        if (root / MANIFEST).exists():
            manifest = read(root, check_model=None).manifest
            if (theirs := manifest["model"]["sha256"]) != model["sha256"]:
                raise UserError(f"mode.out={root} holds a bundle of another model (weights sha256 {theirs[:16]}.., "
                                f"this job's {model['sha256'][:16]}..): record into another folder")
            if manifest["observations"].get("inputs_sha256") != observations["inputs_sha256"]:
                raise UserError(f"mode.out={root} holds a bundle recorded on other inputs ("
                                f"{_obs_label(manifest['observations'])}; this job's: {_obs_label(observations)}): "
                                "record into another folder or use the same obs and seed")
        else:
            manifest = {"format": FORMAT, "format_version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "model": model, "observations": observations, "points": {}, "files": {}}
            files.update({INPUTS: npz_bytes(inputs), REFERENCE: npz_bytes(reference)})
        replaced = key in manifest["points"]
        with terminal.deferred():  # the files and the manifest that lists them: Ctrl-C waits for both
            for name, data in files.items():
                atomic_write(root / name, lambda tmp: Path(tmp).write_bytes(data))
                manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            manifest["points"][key] = {**point, "dir": folder, "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            atomic_write(root / MANIFEST, lambda tmp: Path(tmp).write_bytes(json_bytes(manifest)))
    return manifest, replaced


OWN = re.compile(r"(points/[^/]+/)?(\.?)(manifest\.json|inputs\.npz|reference_fp64\.npz|outputs\.npz|latency\.npz|"
                 r"comparison\.json)(\.\w+)?")  # a bundle's files, and the writer's temporary ones beside them (.<name>.<random>)


def _is_own(name: str) -> bool:
    m = OWN.fullmatch(name)
    return bool(m) and (m[1] is None) == (m[3] in (MANIFEST, INPUTS, REFERENCE)) and bool(m[2]) == bool(m[4])


def check_out(root: Path) -> None:
    """`mode.out` may be a new or empty folder, or a bundle (its manifest or lock there) holding only a bundle's files;
    anything else (the user's files, a file in place of the folder) is refused in one line, before anything is written."""
    root = Path(root).expanduser()
    if not root.is_dir():
        check_unused(root, "mode.out")  # absent, or a file in place of the folder (one line)
        return
    # listed before the manifest and lock are looked for: a writer beside this one (another point of the sweep) may
    # create the lock between the two, and a folder holding only a bundle's lock is a bundle being started, not in use
    names = sorted(p.relative_to(root).as_posix() + ("/" if p.is_dir() else "") for p in root.rglob("*"))
    foreign = [n for n in names if n != LOCK and not _is_own(n) and not re.fullmatch(r"points/([^/]+/)?", n)]
    if foreign and not (root / MANIFEST).is_file() and not (root / LOCK).is_file():
        check_unused(root, "mode.out")
    if foreign:
        raise UserError(f"mode.out={root} holds files that are not a bundle's ({', '.join(foreign[:3])}); refused, so that "
                        "nothing in it is replaced: record into a new or empty folder, or into a bundle")


def leftovers(root: Path) -> list[Path]:
    """A bundle's files its manifest does not list (a record interrupted or killed before it wrote the manifest)."""
    try:
        listed = set(json.loads((root / MANIFEST).read_text())["files"]) if (root / MANIFEST).is_file() else set()
    except (OSError, ValueError, KeyError, TypeError):
        return []  # a damaged manifest: read() names it; nothing is removed
    return [p for p in sorted(root.rglob("*")) if not p.is_dir() and p.name != LOCK and p.name != MANIFEST
            and _is_own(n := p.relative_to(root).as_posix()) and n not in listed]


def _obs_label(obs: dict) -> str:
    return f"obs {obs.get('source')} rows {obs.get('rows')} seed {obs.get('seed')}"


# --- reading: every check first, one line naming the file


@dataclass
class Bundle:
    root: Path
    manifest: dict

    @property
    def points(self) -> dict[str, dict]:
        return self.manifest["points"]

    def inputs(self) -> dict[str, np.ndarray]:
        return load_npz(self.root, INPUTS)

    def reference(self, distributions: bool = False) -> dict[str, np.ndarray]:
        return self._outputs(REFERENCE, distributions)

    def outputs(self, key: str, distributions: bool = False) -> dict[str, np.ndarray]:
        return self._outputs(f"{self.points[key]['dir']}/outputs.npz", distributions)

    def _outputs(self, name: str, distributions: bool) -> dict[str, np.ndarray]:
        arrays = load_npz(self.root, name)
        return arrays if distributions else {k: v for k, v in arrays.items() if k not in DISTRIBUTIONS}

    def latency(self, key: str) -> np.ndarray:
        name = f"{self.points[key]['dir']}/latency.npz"
        seconds = load_npz(self.root, name).get("seconds")
        if seconds is None or seconds.ndim != 1 or len(seconds) > MAX_LATENCY_SAMPLES:
            shown = "no `seconds` array" if seconds is None else f"{list(seconds.shape)} samples"
            raise UserError(f"bundle {self.root}: {name} holds {shown}; a point records one row of at most "
                            f"{MAX_LATENCY_SAMPLES:,} timed calls")
        bad = int(np.sum(~np.isfinite(seconds) | (seconds < 0))) if seconds.dtype.kind == "f" else 0
        if bad or seconds.dtype.kind != "f":
            raise UserError(f"bundle {self.root}: {name} holds {bad or seconds.dtype} samples that are not finite seconds "
                            "(NaN, inf, negative or not floats)")
        return seconds

    def comparison(self, key: str) -> dict:
        found = read_json(self.root / self.points[key]["dir"] / "comparison.json", f"bundle {self.root}:")
        if not isinstance(found, dict):
            raise UserError(f"bundle {self.root}: {self.points[key]['dir']}/comparison.json is not a JSON object")
        return found


def read(root: Path | str, check_model: str | None = None, allow_other_model: bool = False) -> Bundle:
    """The bundle at root, after every check: manifest readable, a known format version, every listed file present
    with its size and sha256, no file that is not listed, and (with check_model) the same model's weights."""
    root = Path(root).expanduser()
    where = f"bundle {root}"
    if not root.is_dir():
        raise UserError(f"{where}: no such folder")
    path = root / MANIFEST
    if not path.is_file():
        raise UserError(f"{where}: {MANIFEST} is missing (not a bundle, or an incomplete copy)")
    manifest = read_json(path, f"{where}:")  # a regular file, under the cap, not too deep, valid JSON: or one line
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{where}: {MANIFEST} is not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version not in READS:
        raise UserError(f"{where}: format version {version!r} is not one this huggy_exp reads (reads {', '.join(map(str, READS))})")
    for section in ("model", "observations", "points", "files"):
        if not isinstance(manifest.get(section), dict):
            raise UserError(f"{where}: {MANIFEST} lacks its {section!r} section")
    listed = manifest["files"]
    for name, entry in listed.items():
        target = (root / name).resolve()
        if Path(name).is_absolute() or ".." in Path(name).parts or root.resolve() not in target.parents:
            raise UserError(f"{where}: {MANIFEST} lists {name!r}, a path outside the bundle: refused")
        if not target.is_file():
            raise UserError(f"{where}: {name} is missing (listed in {MANIFEST})")
        size = target.stat().st_size
        if size != entry.get("bytes"):
            state = "truncated" if size < int(entry.get("bytes") or 0) else "changed size"
            raise UserError(f"{where}: {name} is {state} ({size} bytes, {MANIFEST} says {entry.get('bytes')})")
        digest = sha256_file(target)
        if digest != entry.get("sha256"):
            raise UserError(f"{where}: {name} was modified (sha256 {digest[:16]}.., {MANIFEST} says {str(entry.get('sha256'))[:16]}..)")
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        name = path.relative_to(root).as_posix()
        if name not in listed and name not in (MANIFEST, LOCK):
            raise UserError(f"{where}: {name} is not listed in {MANIFEST}: refused (a bundle holds only what it lists)")
    for key, point in manifest["points"].items():
        if not re.fullmatch(r"[^/]*/[^/]*/[^/]*/b\d+", str(key)):
            raise UserError(f"point key {key!r} is not device/dtype/backend/b<batch> (e.g. cpu/fp32/eager/b64)")
        for stem in ("outputs.npz", "latency.npz", "comparison.json"):
            if f"{point.get('dir')}/{stem}" not in listed:
                raise UserError(f"{where}: point {key} has no {point.get('dir')}/{stem} listed in {MANIFEST}")
    theirs = manifest["model"].get("sha256")
    if check_model is not None and theirs != check_model and not allow_other_model:
        raise UserError(f"{where} was recorded with another model: weights sha256 {theirs}, this job's {check_model} "
                        "(mode.allow_other_model=true compares them anyway)")
    return Bundle(root, manifest)


def load_npz(root: Path, name: str) -> dict[str, np.ndarray]:
    """Arrays of a bundle .npz, never unpickled: an object array is refused, as is a file that is not a zip."""
    path = Path(root) / name
    check_npz(path, f"bundle {root}:")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ValueError as exc:
        raise UserError(f"bundle {root}: {name} holds objects that need pickle: refused ({exc})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise UserError(f"bundle {root}: {name} is not a readable .npz ({exc})") from None


def is_bundle(path: Path | str) -> bool:
    return (Path(path).expanduser() / MANIFEST).is_file()
