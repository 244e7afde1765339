"""Run under tests/emulated_npu.py: what the emulated card does, as one JSON line (test_emulated_npu.py judges it)."""

from __future__ import annotations

import json
import threading

import torch

npu = torch.npu


def refused(fn) -> str:
    try:
        fn()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return ""


def graph_replay(capture_card: int, data_card: int) -> dict:
    """Capture y = x @ w + 1 on `data_card` while `capture_card` is current; replay with new x: fresh or stale?"""
    npu.set_device(capture_card)
    x = torch.ones(2, 3).to(f"npu:{data_card}")
    w = torch.full((3, 2), 2.0).to(f"npu:{data_card}")
    g = npu.NPUGraph()
    with npu.graph(g):
        y = x @ w + 1
    x.copy_(torch.full((2, 3), 3.0))
    g.replay()
    npu.set_device(0)
    return {"card": g.card, "default_stream": g.stream is npu.default_stream(g.card), "ops": len(g.ops),
            "replayed": y.cpu().tolist()[0][0]}


def memory() -> dict:
    npu.reset_peak_memory_stats(1)
    before = npu.memory_allocated(1)
    t = torch.zeros(256, 1024, device="npu:1")  # 1 MiB
    peak = npu.max_memory_allocated(1) - before
    view = t[:10]
    del t
    held = npu.memory_allocated(1) - before  # the view keeps the storage
    del view
    return {"peak": peak, "held_by_view": held, "after": npu.memory_allocated(1) - before,
            "card0_peak_unchanged": npu.max_memory_allocated(0) < 2**20}


def threads() -> dict:
    npu.set_device(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(npu.current_device()))
    worker.start()
    worker.join()
    here = npu.current_device()
    npu.set_device(0)
    return {"main": here, "new_thread": seen[0]}


def hf32() -> dict:
    a = torch.tensor([[1.0 + 2.0**-11, 1.0 + 2.0**-9]]).to("npu:1")
    b = torch.ones(2, 1).to("npu:1")
    exact = (a @ b).cpu().item()
    npu.matmul.allow_hf32 = True
    rounded = (a @ b).cpu().item()
    npu.matmul.allow_hf32 = False
    return {"exact": exact, "hf32": rounded}


@torch.no_grad()
def lstm() -> float:
    torch.manual_seed(0)
    cell = torch.nn.LSTM(5, 4, batch_first=True)
    x = torch.randn(3, 2, 5)
    want = cell(x)[0]
    got = cell.to("npu:1")(x.to("npu:1"))[0].cpu()
    return float((got - want).abs().max())


def perturbed() -> list[float]:
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    return [float(((a.to(f"npu:{i}") @ b.to(f"npu:{i}")).cpu() / (a @ b) - 1).abs().max()) for i in (0, 1)]


def events() -> float:
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    start.record()
    torch.ones(64, 64, device="npu:0").sum().item()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


print(json.dumps({
    "count": npu.device_count(), "name": npu.get_device_name(1), "emulated": npu.EMULATED,
    "fp64": refused(lambda: torch.ones(2, device="npu:0", dtype=torch.float64)),
    "two_cards": refused(lambda: torch.ones(2, device="npu:0") + torch.ones(2, device="npu:1")),
    "host_and_card": refused(lambda: torch.ones(2, device="npu:0") + torch.ones(2)),
    "scalar_ok": (torch.ones(2, device="npu:0") * torch.tensor(2.0)).cpu().tolist(),
    "graph_same_card": graph_replay(1, 1), "graph_other_card": graph_replay(0, 1),
    "memory": memory(), "threads": threads(), "hf32": hf32(), "lstm_max_abs": lstm(), "perturbed": perturbed(),
    "event_ms": events(),
}))
