"""Compose the Hydra config and hand the job to huggy_exp: `python run.py [mode=...] [key=value ...] [-m]`."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from huggy_exp.app import execute
from huggy_exp.results import EXIT_CODES
from huggy_exp.sweep import check_choices


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> str:
    hc = HydraConfig.get()
    result = execute(cfg, Path(hc.runtime.output_dir), hc.runtime.choices["mode"])
    if hc.mode == RunMode.RUN and EXIT_CODES[result.status]:
        sys.exit(EXIT_CODES[result.status])
    return result.status


if __name__ == "__main__":
    check_choices(sys.argv[1:], Path(__file__).parent / "conf")
    main()
