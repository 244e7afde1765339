"""`checkpoints`: list an ML-Agents results folder. Described in docs/modes.md#checkpoints."""

from __future__ import annotations

from huggy_exp.context import Context, results_folder
from huggy_exp.mlagents import list_checkpoints, read_configuration
from huggy_exp.results import Result
from huggy_exp.tasks import Task


class CheckpointsTask(Task):
    def run(self, ctx: Context) -> Result:
        folder = results_folder(ctx.model_spec)
        rows = list_checkpoints(folder)
        config = read_configuration(folder)
        fields = (("_bytes", "bytes"), ("_sha256", "sha256"), ("", "path"))  # per file kind: pt_bytes, onnx_bytes, ...
        table = [{**{k: r.get(k) for k in ("behavior", "step", "reward", "reward_nonfinite", "final", "present")},
                  **{kind + suffix: (r["files"].get(kind) or {}).get(key) for suffix, key in fields for kind in ("pt", "onnx")}}
                 for r in rows]
        rewards = [r["reward"] for r in rows if r["reward"] is not None]
        summary = [f"{folder}: {len(rows)} checkpoints, {sum(r['present'] for r in rows)} with files on disk"]
        summary += [f"{b}: {c['trainer_type']}, {c['num_layers']}x{c['hidden_units']}, normalize {c['normalize']} (configuration.yaml)"
                    for b, c in config.items()]
        for t in table:
            size = t["pt_bytes"] or t["onnx_bytes"]
            reward = t["reward_nonfinite"] or "-" if t["reward"] is None else f"{t['reward']:.3f}"
            files = "missing" if not t["present"] else f"{size:,} B sha256 {(t['pt_sha256'] or t['onnx_sha256'])[:12]}"
            summary.append(f"{t['behavior']} step {t['step']:>9}  reward {reward:>7}  {files}{'  (final)' if t['final'] else ''}")
        odd = [t for t in table if t["reward_nonfinite"]]
        if odd:
            summary.append(f"warning: {len(odd)} reward(s) in training_status.json are not finite "
                           f"({', '.join(sorted({t['reward_nonfinite'] for t in odd}))}): kept as no reward (null), "
                           "left out of best_reward")
        metrics = {"checkpoints": float(len(rows)), "present": float(sum(r["present"] for r in rows)),
                   "nonfinite_rewards": float(len(odd))}
        if rewards:
            metrics["best_reward"] = float(max(rewards))
        return Result(metrics=metrics, tables={"checkpoints": table}, details={"results_dir": str(folder), "checkpoints": rows, "configuration": config},
                      summary=summary)
