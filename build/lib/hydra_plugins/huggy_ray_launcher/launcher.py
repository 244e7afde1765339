"""The Hydra plugin class of `hydra/launcher=ray` (conf/hydra/launcher/ray.yaml); the work is in `_core.py`."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


def _take_the_ray_name() -> None:
    """hydra-ray-launcher stores a schema named `hydra/launcher/ray` (RayLauncherConf: `ray.init`, `ray.remote` and no
    other key), and Hydra validates any config file of that name against it: conf/hydra/launcher/ray.yaml, this
    launcher's config, would be refused for its own keys. Its module is imported first (Hydra's plugin scan imports it
    anyway), then that one entry is dropped; its `ray_aws` launcher keeps its own."""
    try:
        import hydra_plugins.hydra_ray_launcher._config  # noqa: F401  (registers the entries)
    except ImportError:  # the [ray] extra is not installed: nothing to take; preflight names the extra
        return
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().repo.get("hydra", {}).get("launcher", {}).pop("ray.yaml", None)


_take_the_ray_name()


class HuggyRayLauncher(Launcher):
    """Hydra's Ray launcher with per-point resources: each point asks for its device's resource, points no node can
    run are skipped before submission, and a worker's record comes back to the head."""

    def __init__(self, ray: Any, cpus_per_point: int = 1, shared_filesystem: bool = False, connect_timeout_s: float = 10,
                 check_timeout_s: float = 60, return_files_mb: float = 50) -> None:
        self.settings = {"ray": OmegaConf.to_container(ray, resolve=True) if OmegaConf.is_config(ray) else dict(ray),
                         "cpus_per_point": int(cpus_per_point), "shared_filesystem": bool(shared_filesystem),
                         "connect_timeout_s": float(connect_timeout_s), "check_timeout_s": float(check_timeout_s),
                         "return_files_mb": float(return_files_mb)}
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.config: Optional[DictConfig] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.huggy_ray_launcher import _core

        return _core.launch(self, job_overrides, initial_job_idx)
