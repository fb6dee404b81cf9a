"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

- tokens/s by prompt and configuration, the speedup against the baseline written on each bar
  (plain requests: the ``--prefill-think`` variants are in the report's tables);
- acceptance by draft position, one line per configuration that drafted;
- aggregate and per-request throughput against the number of concurrent requests.
"""

from __future__ import annotations

from pathlib import Path

from .results import BenchResult

PLOTS = {
    "tokens_per_second": "tokens_per_second.png",
    "acceptance_by_position": "acceptance_by_position.png",
    "throughput_concurrency": "throughput_concurrency.png",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_tokens_per_second(res: BenchResult, path: Path) -> Path:
    plt = _pyplot()
    configs = [c for c in res.configs if c.error is None]
    keys = list(dict.fromkeys((p.prompt_id, p.thinking) for c in configs for p in c.by_prompt if p.prefill is None))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.45 * len(keys) * max(len(configs), 1)), 4.5))
    if not keys:
        _empty(ax, "no completed requests")
    width = 0.8 / max(len(configs), 1)
    for j, c in enumerate(configs):
        figs = {(p.prompt_id, p.thinking): p.figures for p in c.by_prompt if p.prefill is None}
        xs = [i + (j - (len(configs) - 1) / 2) * width for i in range(len(keys))]
        ys = [(figs[k].decode_tokens_per_second or 0.0) if k in figs else 0.0 for k in keys]
        bars = ax.bar(xs, ys, width, label=c.name)
        for b, k in zip(bars, keys):
            f = figs.get(k)
            if f is not None and f.speedup is not None:
                ax.annotate(
                    f"×{f.speedup:.2f}",
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90 if len(configs) > 3 else 0,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    label = {None: "", True: "\nthinking", False: "\nno thinking"}
    ax.set_xticks(range(len(keys)), [f"{p}{label[t]}" for p, t in keys], fontsize=8)
    ax.set_ylabel("decode tokens/s (mean)")
    base = f"speedup vs. {res.baseline}" if res.baseline else "no baseline: no speedup"
    ax.set_title(f"Decode tokens/s by prompt and configuration ({base})", fontsize=10)
    if configs:
        ax.legend(fontsize=8)
    ax.margins(y=0.15)
    return _save(fig, path)


def plot_acceptance_by_position(res: BenchResult, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    drew = False
    for c in res.configs:
        acc = c.overall.per_position_acceptance if c.error is None else []
        if acc:  # a configuration that drafted (0 % accepted is a result too)
            rate = c.overall.acceptance_rate
            ax.plot(
                range(1, len(acc) + 1),
                [100 * a for a in acc],
                marker="o",
                label=f"{c.name} (acceptance {100 * rate:.1f} %)" if rate is not None else c.name,
            )
            drew = True
    if drew:
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted at this position (% of drafts)")
        ax.set_ylim(-2, 102)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no accepted draft tokens measured\n(no /metrics, or no configuration drafted)")
    ax.set_title("Acceptance by draft position", fontsize=10)
    return _save(fig, path)


def plot_throughput_concurrency(res: BenchResult, path: Path) -> Path:
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    drew = False
    for c in res.configs:
        waves = [w for w in c.concurrency if w.aggregate_tokens_per_second is not None] if c.error is None else []
        if waves:
            xs = [w.concurrency for w in waves]
            a1.plot(xs, [w.aggregate_tokens_per_second for w in waves], marker="o", label=c.name)
            a2.plot(xs, [w.per_request_tokens_per_second or 0.0 for w in waves], marker="o", label=c.name)
            drew = True
    for ax, what in ((a1, "aggregate output tokens/s"), (a2, "per-request tokens/s (queueing included)")):
        if drew:
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel(what)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no concurrency sweep")
        ax.set_title(what[0].upper() + what[1:], fontsize=10)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def write_plots(res: BenchResult, out_dir: Path) -> dict[str, Path]:
    return {
        "tokens_per_second": plot_tokens_per_second(res, out_dir / PLOTS["tokens_per_second"]),
        "acceptance_by_position": plot_acceptance_by_position(res, out_dir / PLOTS["acceptance_by_position"]),
        "throughput_concurrency": plot_throughput_concurrency(res, out_dir / PLOTS["throughput_concurrency"]),
    }
