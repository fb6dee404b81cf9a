"""Training curves as PNG (matplotlib, Agg backend: no display needed).

- ``loss.png``: the training loss per optimizer step (each chained step, and their weighted mean),
  and the held-out loss of the first step after each epoch;
- ``acceptance.png``: held-out greedy acceptance per draft position after each epoch, with the
  mean acceptance length in the legend.
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _smooth(xs: list[float], n: int = 9) -> list[float]:
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-n:]
        out.append(sum(acc) / len(acc))
    return out


def plot_curves(history: list[dict], folder: Path, *, name: str = "MTP head") -> list[Path]:
    """Write loss.png and acceptance.png for ``history`` (train.py's records) into ``folder``."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    steps = [h for h in history if "loss" in h]
    evals = [h for h in history if h.get("eval")]

    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        xs = [h["step"] for h in steps]
        ax.plot(xs, _smooth([h["loss"] for h in steps]), label="train (weighted, smoothed)")
        for d in range(len(steps[0]["per_depth"])):
            ax.plot(xs, _smooth([h["per_depth"][d] for h in steps]), lw=0.8, alpha=0.7, label=f"train, step {d + 1}")
    if evals:
        ax.plot([h["step"] for h in evals], [h["eval"]["loss"] for h in evals], "ko-", label="held-out, step 1")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("soft cross-entropy (nats)")
    ax.set_title(f"{name}: loss against the target's top-k")
    ax.legend(fontsize=8)
    loss_png = folder / "loss.png"
    fig.tight_layout()
    fig.savefig(loss_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for h in evals:
        acc = h["eval"]["acceptance_per_position"]
        label = f"{_when(h)}: mean length {h['eval']['mean_acceptance_length']:.2f}"
        ax.plot(range(1, len(acc) + 1), [100 * a for a in acc], marker="o", label=label)
    if not evals:
        ax.text(0.5, 0.5, "no held-out evaluation yet", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xlabel("draft position")
    ax.set_ylabel("greedy acceptance (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{name}: held-out acceptance by draft position")
    ax.legend(fontsize=8)
    acc_png = folder / "acceptance.png"
    fig.tight_layout()
    fig.savefig(acc_png, dpi=110)
    plt.close(fig)
    return [loss_png, acc_png]


def _when(h: dict) -> str:
    """A held-out evaluation's legend: its epoch for a head, its stage and step for a heal (whose
    stages share epochs: the whole-model stage restarts at 0), and what a kept entry kept.

    >>> _when({"epoch": 2.0, "step": 40}), _when({"stage": "whole", "step": 931, "epoch": 0.0})
    ('epoch 2', 'whole model, step 931')
    >>> _when({"stage": "rows", "step": 0}), _when({"stage": "rows", "step": 90, "kept_step": 37})
    ('start', 'kept: step 37')
    """
    if "kept_step" in h:
        if h.get("stage") == "whole":
            return "whole model put back"
        return "kept: start" if h["kept_step"] == 0 else f"kept: step {h['kept_step']}"
    if "stage" not in h:
        return f"epoch {h['epoch']:.0f}"
    if h["step"] == 0:
        return "start"
    return f"{'whole model' if h['stage'] == 'whole' else 'new rows'}, step {h['step']}"
