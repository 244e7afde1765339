"""ML-Agents runs on the Hugging Face Hub, fetched as a results folder."""

from __future__ import annotations

import re
from pathlib import Path

from huggy_exp.errors import UserError
from huggy_exp.mlagents.default import cache_dir


def fetch_hub(repo_id: str) -> Path:
    """Download a Hugging Face ML-Agents repo (Huggy layout) and return it as a results folder."""
    hint = "pass local files instead: model.checkpoint=<file.pt>, model.onnx=<file.onnx> or model.results_dir=<folder>"
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id or ""):
        raise UserError(f"model.hub_repo={repo_id!r} is not of the form <owner>/<name>")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"model.hub_repo needs huggingface_hub (pip install 'huggy-exp[hub]'); or {hint}") from None
    try:
        return Path(snapshot_download(repo_id, cache_dir=str(cache_dir() / "hub")))
    except Exception as exc:
        raise UserError(f"could not fetch {repo_id} from the Hugging Face Hub ({type(exc).__name__}; offline?); {hint}") from None
