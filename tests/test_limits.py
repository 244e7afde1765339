"""Limits fail closed: every entry of the one per-dtype table (`verify.limits`), removed in turn, is an error naming the
key (on the command line, in a config file), never a pass judged against a default; a dtype is declared once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CONF, compose_config
from omegaconf import MISSING, OmegaConf

from huggy_exp import config, numerics, placement, preflight, verify
from huggy_exp.app import execute
from huggy_exp.config import DTYPE_NAMES, LIMIT_ROWS
from huggy_exp.errors import UserError

LIMIT_MODES = ("action", "batch", "benchmark", "replay", "onnx-compare", "precision")  # every mode judging by the table


def tables(plain: dict, prefix: str = "") -> list[str]:
    """The keys of every per-dtype table in a composed config (a mapping whose keys are the dtypes)."""
    found = []
    for key, value in plain.items():
        if isinstance(value, dict):
            if set(value) == set(LIMIT_ROWS):
                found.append(f"{prefix}{key}")
            found += tables(value, f"{prefix}{key}.")
    return found


def entries() -> list[tuple[str, str]]:
    """(mode, key) for each dtype's entry of each table, and each field of the job's own dtype (fp32) entry."""
    out = []
    for mode in LIMIT_MODES[:1]:  # verify.limits is the same table in every mode; each mode's own field: below
        plain = OmegaConf.to_container(compose_config([f"mode={mode}"]), resolve=True)
        for table in tables(plain):
            out += [(mode, f"{table}.{d}") for d in LIMIT_ROWS]
            fp32 = OmegaConf.select(OmegaConf.create(plain), f"{table}.fp32")
            out += [(mode, f"{table}.fp32.{f}") for f in (fp32 if OmegaConf.is_dict(fp32) else ())]
    return out


def test_every_limit_table_is_found():
    found = {key.rsplit(".", 1)[0] for _, key in entries() if key.rsplit(".", 1)[1] in LIMIT_ROWS}
    assert found == {"verify.limits"}, found  # one per-dtype table: every mode's limits


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
    [table] = tables(OmegaConf.to_container(cfg, resolve=True))
    OmegaConf.update(cfg, f"{table}.bf16", MISSING)
    result = execute(cfg, tmp_path, mode)
    assert result.status == "error" and result.reason == f"missing key {table}.bf16"


@pytest.mark.parametrize("mode, field", [("action", "kl_max"), ("batch", "batch_max_abs"), ("benchmark", "max_abs"),
                                         ("replay", "max_abs"), ("onnx-compare", "max_abs"),
                                         ("precision", "layer_rel_rmse")])
def test_the_limit_each_mode_reads_left_out_of_a_config_file_makes_the_job_an_error(mode, field, tmp_path):
    cfg = compose_config([f"mode={mode}", "tracking=none", "dtype=bf16"])
    OmegaConf.update(cfg, f"verify.limits.bf16.{field}", MISSING)
    result = execute(cfg, tmp_path, mode)
    assert result.status == "error" and result.reason == f"missing key verify.limits.bf16.{field}"


def test_a_dtype_without_a_limit_is_an_error_not_a_default():
    with pytest.raises(UserError, match="^verify.limits.bf16 is missing"):
        numerics.limits_for({"fp32": {"max_abs": 1e-5}}, "bf16", "cpu", None, "verify.limits")


def test_a_dtype_declared_once_gives_the_torch_dtype_its_ulps_and_its_quantization():
    """config.DTYPES is the one declaration of a dtype; placement and verify read it."""
    assert placement.DTYPES == {"int8": torch.float32, "int8w": torch.float32, "bf16": torch.bfloat16,
                                "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
    assert set(placement.QUANTIZED) == {"int8", "int8w"} and DTYPE_NAMES == tuple(config.DTYPES)
    for name, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32),
                              ("fp64", torch.float64)):
        info = torch.finfo(torch_dtype)
        assert verify.ulp(np.array([1.0]), name)[0] == info.eps  # one ULP at 1.0
        assert verify.ulp(np.array([info.tiny / 4]), name)[0] == info.tiny * info.eps  # subnormals: the least normal's


def test_a_device_exception_reaches_the_limit_a_mode_reads_itself(tmp_path):
    """verify.specialize holds any key of a row: a cpu_fp32 exception tightening batch_max_abs fails mode=batch."""
    cfg = compose_config(["mode=batch", "tracking=none", "obs.rows=16", "batch_size=8", "mode.budget_s=0.05",
                          "++verify.specialize.cpu_fp32={batch_max_abs: 0.0}"])
    result = execute(cfg, tmp_path, "batch")
    assert result.status == "failed" and "batch invariance" in result.reason, result.reason
