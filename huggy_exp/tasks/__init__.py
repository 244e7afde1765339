"""One small class per mode: __init__(knobs from conf/mode/<name>.yaml) and run(ctx) -> Result."""

from __future__ import annotations

from typing import Protocol

from huggy_exp.context import Context
from huggy_exp.results import Result


class Task(Protocol):
    name: str

    def run(self, ctx: Context) -> Result: ...
