"""Edges added after the core: configuration.yaml cross-checks, bounded MLflow retries, the Hub when offline, cases."""

from __future__ import annotations

import os
import time

import pytest

from conftest import CONF, compose_config, model_conf, run_job
from huggy_exp import mlagents, tracking
from huggy_exp.context import open_model
from huggy_exp.errors import UserError


def test_checkpoints_reports_the_run_configuration(tmp_path, results_folder):
    r = run_job(tmp_path, "checkpoints", f"model.results_dir={results_folder}").record
    assert r["details"]["configuration"]["Huggy"] == {"trainer_type": "ppo", "hidden_units": 32, "num_layers": 2,
                                           "normalize": True, "max_steps": None}


def test_info_says_configuration_agrees_with_the_weights(tmp_path, results_folder):
    r = run_job(tmp_path, "info", f"model.checkpoint={results_folder / 'Huggy' / 'Huggy-200.pt'}").record
    assert r["details"]["configuration"]["hidden_units"] == 32
    assert r["details"]["configuration_mismatches"] == []


def test_configuration_mismatch_names_the_setting(huggy_actor):
    config = {"hidden_units": 512, "num_layers": 2, "normalize": False}
    problems = mlagents.configuration_mismatches(config, huggy_actor.policy_weights())
    assert problems == ["hidden_units: configuration.yaml says 512, weights have 32",
                        "normalize: configuration.yaml says False, weights have True"]


def test_invalid_configuration_yaml_is_a_user_error(tmp_path):
    (tmp_path / "configuration.yaml").write_text("behaviors: [unclosed\n")
    with pytest.raises(UserError, match="configuration.yaml is not valid YAML"):
        mlagents.read_configuration(tmp_path)


def test_embedded_default_carries_a_configuration(default_model):
    config = mlagents.read_configuration(default_model.path.parent.parent)
    assert config["Huggy"]["hidden_units"] == 512 and config["Huggy"]["num_layers"] == 3


def test_mlflow_http_retries_are_bounded_unless_the_environment_says_otherwise(monkeypatch):
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "33")
    tracking.http_limits({"http_retries": 1, "http_timeout_s": 5})
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "33"  # the user's own setting wins


def test_a_tracking_server_that_is_down_costs_seconds_not_minutes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    started = time.monotonic()
    job = run_job(tmp_path, "action", tracking="http://127.0.0.1:9")
    assert time.monotonic() - started < 60
    assert job.record["status"] == "passed"
    assert job.record["tracking"]["status"] == "pending" and "127.0.0.1:9" in job.record["tracking"]["reason"]
    assert "not in MLflow yet" in capsys.readouterr().err


@pytest.mark.parametrize("repo", ["not-a-repo-id", "a/b/c"])
def test_hub_repo_must_be_owner_slash_name(repo):
    with pytest.raises(UserError, match="<owner>/<name>"):
        mlagents.fetch_hub(repo)


def test_hub_offline_says_how_to_pass_local_files(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HUGGY_EXP_CACHE", str(tmp_path))
    with pytest.raises(UserError) as err:
        open_model(model_conf(hub_repo="nobody/ppo-Huggy"))
    message = str(err.value)
    assert "nobody/ppo-Huggy" in message and "model.checkpoint=" in message and "\n" not in message


@pytest.mark.parametrize("case, mode, dtype", [("bf16_extreme", "precision", "bf16"), ("fp16_closed_loop", "stats", "fp16")])
def test_example_cases_compose(case, mode, dtype):
    cfg = compose_config([f"case={case}"])
    assert cfg.mode._target_.endswith({"precision": "PrecisionTask", "stats": "StatsTask"}[mode])
    assert cfg.dtype == dtype


def test_export_onnx_to_a_chosen_path_is_still_an_mlflow_artifact(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    target = tmp_path / "elsewhere" / "Policy.onnx"
    job = run_job(tmp_path / "job", "export-onnx", f"mode.path={target}", "obs.rows=8", tracking=uri)
    assert job.record["status"] == "passed", job.record["reason"]
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id])
    assert "Policy.onnx" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_sac_policy_with_conditional_sigma_loads_and_acts_like_mlagents(huggy_actor, tmp_path):
    """SAC actors: log_sigma is a Linear layer, the deterministic output is raw mu, samples are tanh-squashed."""
    import numpy as np
    import torch

    from conftest import LOG_SIGMA
    from huggy_exp.placement import resolve
    from huggy_exp.runners import ACTIONS, SAMPLED, OnnxRunner, TorchRunner

    state = huggy_actor.state_dict()
    del state[LOG_SIGMA]
    hidden = huggy_actor.mu_w.shape[1]
    rng = np.random.default_rng(5)
    sig_w = rng.normal(0, 0.1, (huggy_actor.spec.act, hidden)).astype(np.float32)
    sig_b = rng.normal(-1, 0.1, huggy_actor.spec.act).astype(np.float32)
    state[LOG_SIGMA + ".weight"], state[LOG_SIGMA + ".bias"] = torch.from_numpy(sig_w), torch.from_numpy(sig_b)
    path = huggy_actor.save(tmp_path / "sac.pt", state=state)

    w = mlagents.load_checkpoint(path).weights
    assert w.conditional_sigma and w.tanh_squash
    obs = huggy_actor.in_distribution_obs(16, seed=9)
    runner = TorchRunner(w, resolve("cpu", "fp64"))
    np.testing.assert_allclose(runner.infer({"obs_0": obs})[ACTIONS], huggy_actor.mu(obs), atol=1e-9)
    sampled = runner.sample({"obs_0": obs}, seed=0)[SAMPLED]
    assert np.abs(sampled).max() < 1.0 and not np.allclose(sampled, np.tanh(huggy_actor.mu(obs)))

    mlagents.write_onnx(w, tmp_path / "sac.onnx")
    back = mlagents.load_onnx(tmp_path / "sac.onnx").weights
    assert back.conditional_sigma and back.tanh_squash
    np.testing.assert_array_equal(back.log_sigma[0], sig_w)
    ort = OnnxRunner(tmp_path / "sac.onnx").infer({"obs_0": obs})
    np.testing.assert_allclose(ort[ACTIONS], huggy_actor.mu(obs), atol=1e-5)


@pytest.mark.parametrize("override", ["seed=abc", "batch_size=2.5", "obs.rows=x", "obs.scale=big", "batch_size=1e9"])
def test_untyped_numbers_on_the_command_line_are_user_errors(override):
    from huggy_exp.preflight import check as preflight, setup

    setup()
    with pytest.raises(UserError) as err:
        preflight([override], CONF)
    assert override in str(err.value) and "\n" not in str(err.value)
