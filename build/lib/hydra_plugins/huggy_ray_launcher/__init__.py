"""huggy_exp's Ray launcher (`hydra/launcher=ray`): each sweep point on a node that has its device.

Hydra finds plugins by importing the modules of the `hydra_plugins` namespace package whose names do not start with
`_`: `launcher.py` is imported at every start-up and imports nothing but Hydra; `_core.py` (Ray itself) only when a
sweep launches. docs/tracking-and-sweeps.md#ray-across-hosts.
"""
