"""Limit tables fail closed: every entry of every per-dtype table, removed in turn, is an error naming the key (on the
command line, in a config file, in a task's own table), never a pass judged against a default."""

from __future__ import annotations

import pytest
from conftest import CONF, compose_config
from omegaconf import MISSING, OmegaConf

from huggy_exp import placement, preflight, verify
from huggy_exp.app import execute
from huggy_exp.config import DTYPE_NAMES
from huggy_exp.errors import UserError

LIMIT_MODES = ("action", "batch", "benchmark", "replay", "onnx-compare", "precision")  # every mode with a table of its own


def tables(plain: dict, prefix: str = "") -> list[str]:
    """The keys of every per-dtype table in a composed config (a mapping whose keys are the dtypes)."""
    found = []
    for key, value in plain.items():
        if isinstance(value, dict):
            if set(value) == set(DTYPE_NAMES):
                found.append(f"{prefix}{key}")
            found += tables(value, f"{prefix}{key}.")
    return found


def entries() -> list[tuple[str, str]]:
    """(mode, key) for each dtype's entry of each table, and each field of the job's own dtype (fp32) entry."""
    out = []
    for mode in LIMIT_MODES:
        plain = OmegaConf.to_container(compose_config([f"mode={mode}"]), resolve=True)
        for table in tables(plain):
            if table.startswith("verify.") and mode != "action":
                continue  # verify.limits is the same table in every mode
            out += [(mode, f"{table}.{d}") for d in DTYPE_NAMES]
            fp32 = OmegaConf.select(OmegaConf.create(plain), f"{table}.fp32")
            out += [(mode, f"{table}.fp32.{f}") for f in (fp32 if OmegaConf.is_dict(fp32) else ())]
    return out


def test_every_limit_table_is_found():
    found = {key.rsplit(".", 1)[0] for _, key in entries() if key.rsplit(".", 1)[1] in DTYPE_NAMES}
    assert found == {"verify.limits", "mode.tolerance", "mode.atol", "mode.layer_thresholds"}, found


@pytest.mark.parametrize("mode, key", entries(), ids=lambda v: v)
def test_a_limit_removed_on_the_command_line_is_an_error_naming_it(mode, key, tmp_path):
    preflight.setup()
    with pytest.raises(UserError) as err:
        preflight.check([f"mode={mode}", "tracking=none", f"~{key}", f"hydra.run.dir={tmp_path}"], CONF)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
    assert not (tmp_path / "result.json").exists()  # no job ran, so none passed


@pytest.mark.parametrize("mode", LIMIT_MODES)
def test_a_limit_a_config_file_leaves_out_makes_the_job_an_error(mode, tmp_path):
    cfg = compose_config([f"mode={mode}", "tracking=none", "dtype=bf16"])
    table = [t for t in tables(OmegaConf.to_container(cfg, resolve=True)) if mode == "action" or t.startswith("mode.")][0]
    OmegaConf.update(cfg, f"{table}.bf16", MISSING)
    result = execute(cfg, tmp_path, mode)
    assert result.status == "error" and result.reason == f"missing key {table}.bf16"


def test_a_dtype_without_a_limit_in_a_task_table_is_an_error_not_a_default():
    with pytest.raises(UserError, match="^mode.tolerance has no bf16 limit"):
        verify.limit({"fp32": 1e-5}, "bf16", "mode.tolerance")


@pytest.mark.parametrize("table", [placement.DTYPES, verify.ULP_STANDARD, verify._ULP_FORMAT],
                         ids=["placement.DTYPES", "verify.ULP_STANDARD", "verify._ULP_FORMAT"])
def test_every_code_table_by_dtype_names_every_dtype(table):
    assert set(table) == set(DTYPE_NAMES)
