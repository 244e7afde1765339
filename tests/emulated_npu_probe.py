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


def graph_replay(card: int) -> dict:
    """Capture y = x @ w + 1 on `card` (its current card), replay with a new x: the replay computes on the new values."""
    npu.set_device(card)
    x = torch.ones(2, 3).to(f"npu:{card}")
    w = torch.full((3, 2), 2.0).to(f"npu:{card}")
    g = npu.NPUGraph()
    with npu.graph(g):
        y = x @ w + 1
    unreplayed = y.cpu().tolist()[0][0]  # a capture runs nothing: its outputs hold no value until replay
    x.copy_(torch.full((2, 3), 3.0))
    g.replay()
    npu.set_device(0)
    return {"card": g.card, "default_stream": g.stream is npu.default_stream(g.card), "ops": len(g.ops),
            "unreplayed_is_nan": unreplayed != unreplayed, "replayed": y.cpu().tolist()[0][0]}


def capture_on_the_wrong_card() -> dict:
    """After graph_replay(1), the process's capture stream is card 1's (torch_npu's `graph.default_capture_stream`, made
    at the first capture): a capture of y = x + 1 on card 0 without `stream=` runs on card 1's stream, records nothing
    of card 0, and a replay leaves y stale. With a stream of card 0 passed, the same capture records the op."""
    npu.set_device(0)
    x = torch.ones(2, 3).to("npu:0")
    found = {}
    for how, stream in (("default", None), ("own_stream", npu.Stream(0))):
        g = npu.NPUGraph()
        with npu.graph(g, stream=stream):
            y = x + 1
        x.copy_(torch.full((2, 3), 3.0))
        g.replay()
        found[how] = {"card": g.card, "ops": len(g.ops), "replayed": y.cpu().tolist()[0][0]}
        x.copy_(torch.ones(2, 3))
    return found


def memory() -> dict:
    npu.set_device(1)
    npu.reset_peak_memory_stats(1)
    before = npu.memory_allocated(1)
    t = torch.zeros(256, 1024, device="npu:1")  # 1 MiB
    peak = npu.max_memory_allocated(1) - before
    view = t[:10]
    del t
    held = npu.memory_allocated(1) - before  # the view keeps the storage
    del view
    npu.set_device(0)
    return {"peak": peak, "held_by_view": held, "after": npu.memory_allocated(1) - before,
            "card0_peak_unchanged": npu.max_memory_allocated(0) < 2**20}


def threads() -> dict:
    """The current card is per thread: a new thread starts on card 0 and must call set_device to use card 1."""
    npu.set_device(1)
    seen, errors = [], []

    def worker(set_first: bool) -> None:
        seen.append(npu.current_device())
        if set_first:
            npu.set_device(1)
        errors.append(refused(lambda: torch.ones(2, device="npu:1").sum().item()))

    for set_first in (False, True):
        t = threading.Thread(target=worker, args=(set_first,))
        t.start()
        t.join()
    here = npu.current_device()
    npu.set_device(0)
    return {"main": here, "new_thread": seen, "without_set_device": errors[0], "with_set_device": errors[1]}


def hf32() -> dict:
    npu.set_device(1)
    a = torch.tensor([[1.0 + 2.0**-11, 1.0 + 2.0**-9]]).to("npu:1")
    b = torch.ones(2, 1).to("npu:1")
    exact = (a @ b).cpu().item()
    npu.matmul.allow_hf32 = True
    rounded = (a @ b).cpu().item()
    npu.matmul.allow_hf32 = False
    npu.set_device(0)
    return {"exact": exact, "hf32": rounded}


@torch.no_grad()
def lstm() -> float:
    torch.manual_seed(0)
    cell = torch.nn.LSTM(5, 4, batch_first=True)
    x = torch.randn(3, 2, 5)
    want = cell(x)[0]
    npu.set_device(1)
    got = cell.to("npu:1")(x.to("npu:1"))[0].cpu()
    npu.set_device(0)
    return float((got - want).abs().max())


def perturbed() -> list[float]:
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    out = []
    for i in (0, 1):
        npu.set_device(i)
        out.append(float(((a.to(f"npu:{i}") @ b.to(f"npu:{i}")).cpu() / (a @ b) - 1).abs().max()))
    npu.set_device(0)
    return out


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
    "no_context": refused(lambda: torch.ones(2, device="npu:1")),  # before this thread's first set_device
    "two_cards": (npu.set_device(0), refused(lambda: torch.ones(2, device="npu:0") + torch.ones(2, device="npu:1")))[1],
    "host_and_card": refused(lambda: torch.ones(2, device="npu:0") + torch.ones(2)),
    "scalar_ok": (torch.ones(2, device="npu:0") * torch.tensor(2.0)).cpu().tolist(),
    "graph": graph_replay(1), "graph_wrong_card": capture_on_the_wrong_card(),
    "memory": memory(), "threads": threads(), "hf32": hf32(), "lstm_max_abs": lstm(), "perturbed": perturbed(),
    "event_ms": events(),
}))
