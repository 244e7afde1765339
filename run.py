"""Compose the Hydra config and hand the job to huggy_exp: `python run.py [mode=...] [key=value ...] [-m]`."""

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from huggy_exp import config
from huggy_exp.errors import UserError

CONF = Path(__file__).parent / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> str:
    from huggy_exp.app import JobInfo, execute, exit_code, sync, ui

    config.setup()  # the resolvers, again: joblib and submitit run this function in fresh processes
    hc = HydraConfig.get()
    mode = hc.runtime.choices["mode"]
    if mode == "sync":
        sys.exit(sync(cfg))
    if mode == "ui":
        sys.exit(ui(cfg))
    multirun = hc.mode == RunMode.MULTIRUN
    launcher = hc.runtime.choices.get("hydra/launcher", "basic")
    job = JobInfo(overrides=tuple(hc.overrides.task), case=hc.runtime.choices.get("case"),
                  sweep_dir=Path(hc.sweep.dir) if multirun else None, num=hc.job.num if multirun else None,
                  launcher=launcher, shared_machine=multirun and config.shares_machine(launcher, hc.launcher))
    result = execute(cfg, Path(hc.runtime.output_dir), mode, job)
    code = exit_code(result, cfg.get("expect"))
    if not multirun and code:
        sys.exit(code)
    return result.status


def cli(argv: list[str]) -> None:
    """Validate every job first (one line, exit 2, on the first bad value), then let Hydra run them."""
    config.setup()
    try:
        argv = config.normalize_argv(argv)
        sys.argv[1:] = argv
        jobs = config.preflight(argv, CONF)
        os.environ[config.JOBS_ENV] = str(jobs)  # the sweep's size, for its progress lines (sweep.json)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except KeyboardInterrupt:
        from huggy_exp.sweep import interrupted

        sys.exit(interrupted())


if __name__ == "__main__":
    cli(sys.argv[1:])
