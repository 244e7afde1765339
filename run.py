"""Compose the Hydra config and hand the job to huggy_exp: `python run.py [mode=...] [key=value ...] [-m]`."""

import functools
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from huggy_exp import config, preflight, terminal
from huggy_exp.errors import UserError
from huggy_exp.tracking_worker import Helper

CONF = Path(__file__).parent / "conf"


def one_job(cfg: DictConfig, tracker=None) -> str:
    from huggy_exp import app

    preflight.setup()  # the resolvers, again: joblib and submitit run this function in fresh processes
    terminal.guard_output()
    hc = HydraConfig.get()
    mode = hc.runtime.choices["mode"]
    if not config.modes()[mode].is_task():  # `_target_: null`: app's command of the mode's name, its exit code
        sys.exit(getattr(app, mode)(cfg, Path(hc.runtime.output_dir)))
    multirun = hc.mode == RunMode.MULTIRUN
    launcher = hc.runtime.choices.get("hydra/launcher", "basic")
    job = app.JobInfo(overrides=tuple(hc.overrides.task), case=hc.runtime.choices.get("case"),
                      sweep_dir=Path(hc.sweep.dir) if multirun else None, num=hc.job.num if multirun else None,
                      launcher=launcher, shared_machine=multirun and preflight.shares_machine(launcher, hc.launcher),
                      tracker=tracker, **app.point_info())
    result = app.execute(cfg, Path(hc.runtime.output_dir), mode, job)
    terminal.check_pipe()  # output closed (`| head`): this job is kept, the sweep ends here
    code = app.exit_code(result, cfg.get("expect"))
    if not multirun and code:
        sys.exit(code)
    return result.status


main = hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")(one_job)


def ray_preflight(composed: list[DictConfig]) -> None:
    """hydra/launcher=ray: the extra is installed, the cluster answers, every point can be placed, the store is reachable
    from every node (Ray is imported only here, for Ray sweeps)."""
    from huggy_exp import cluster

    cluster.require_ray()
    launcher = composed[0].hydra.launcher
    address = ((launcher.get("ray") or {}).get("init") or {}).get("address")
    if address:  # before Ray's import: an address nothing answers at costs seconds, not Ray's minutes of retries
        cluster.check_reachable(str(address), float(launcher.get("connect_timeout_s") or 10))
    from hydra_plugins.huggy_ray_launcher import _core

    _core.preflight(composed)


def cli(argv: list[str], mlflow_helper: bool = False) -> None:
    """Validate every job first (one line, exit 2, on the first bad value), then let Hydra run them. `mlflow_helper`: a
    single run imports mlflow in a helper process beside the job (in-process callers pay mlflow's import once). Output
    survives a closed pipe or an ASCII terminal, and SIGTERM ends the jobs as Ctrl-C does (huggy_exp/terminal.py)."""
    with terminal.guarded():
        _cli(argv, mlflow_helper)


def _cli(argv: list[str], mlflow_helper: bool) -> None:
    preflight.setup()
    single = preflight.single_run(argv)
    # MLflow's import (2-3 s of CPU) starts now in a helper process, beside torch's import and the job
    tracked = mlflow_helper and single and not {"tracking=none", "tracking.enabled=false"} & set(argv)
    helper = Helper.start() if tracked else None
    composed: list[DictConfig] = []
    try:
        try:
            argv = preflight.normalize_argv(argv)
            jobs = preflight.check(argv, CONF, keep=composed)  # may add tracking.uri='<masked>' (a file's secret)
            sys.argv[1:] = argv
            os.environ[preflight.JOBS_ENV] = str(jobs)  # the sweep's size, for its progress lines (sweep.json)
            if {"-m", "--multirun"} & set(argv) and composed and composed[0].hydra.runtime.choices.get("hydra/launcher") == "ray":
                ray_preflight(composed)
            if composed:
                preflight.claim(composed[0], bool({"-m", "--multirun"} & set(argv)))
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        once = composed[0] if len(composed) == 1 and single else None
        if helper and not (once and once.tracking.enabled and config.modes()[once.hydra.runtime.choices.mode].is_task()):
            helper.close()  # nothing to log after all (tracking off in a case file; sync and ui work in this process)
            helper = None
        if once:
            preflight.run_once(once, functools.partial(one_job, tracker=helper))  # composed once, by preflight
        else:
            main()
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, a closed pipe (terminal.Interrupted)
        from huggy_exp.sweep import interrupted

        sys.exit(interrupted(exc))
    finally:
        if helper:
            helper.close()


if __name__ == "__main__":
    cli(sys.argv[1:], mlflow_helper=True)
