"""docs/results/parallel_scaling.png: the speed-up of two ranks over one, per workload, beside
the ideal (the docs page "Training in parallel"), read from the benchmarks' JSON output.

The sources, each a benchmark's JSON copied as written (``RUNS``):

- ``lenet5_launches``: ``mnist_lenet5.py --methods fln:r2t1,fln:t1,adam:t1,adam:t2,adam:r2t1``
  (seconds per epoch of FLN and of Adam, one rank of one thread against two);
- ``figure1_ranks``: ``figure1_ranks.py`` (Figure 1's FLN round, the median unchecked round);
- ``parallel_model``: ``parallel_model.py`` (the MNIST MLP's FLN batch on 4,000 images, the
  repeat of median speed-up, with the ceiling: P one-rank runs at once).

    python benchmarks/scaling_plot.py
"""

import json
from pathlib import Path

from fenchel_cvx.io import atomic_write

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results"
RUNS = ("lenet5_launches", "figure1_ranks", "parallel_model")


def load(name):
    return json.loads((DATA / f"{name}.json").read_text())


def speed_ups():
    """``{workload: (one rank's seconds, two ranks')}`` from ``RUNS``, and the MLP's ceiling."""
    lenet = load("lenet5_launches")["methods"]
    round_ = load("figure1_ranks")
    mlp = load("parallel_model")["mlp"]
    per_epoch = lambda name: lenet[name]["seconds_per_epoch"]  # noqa: E731
    pairs = {
        "FLN, LeNet-5 (s/epoch)": (per_epoch("fln:t1"), per_epoch("fln:r2t1")),
        "Adam under DDP, LeNet-5 (s/epoch)": (per_epoch("adam:t1"), per_epoch("adam:r2t1")),
        "FLN, Figure 1's round": (round_["one_rank"]["round"], round_["p_ranks"]["round"]),
        "FLN, MLP (s/batch)": median_repeat(mlp),
    }
    return pairs, mlp["ceiling"]["speedup"]


def median_repeat(run):
    """``(one rank's seconds, P ranks')`` of the repeat of a ``parallel_model.py`` run whose
    speed-up is the median of its repeats' (the one its speed-up reports; with an even count,
    the lower middle); a run without repeats: its one-rank and P-rank batches."""
    repeats = sorted(
        run["measured"].get("repeats", []), key=lambda r: r["one_rank_s"] / r["batch_P_s"]
    )
    if not repeats:
        return run["batch_s"], run["measured"]["batch_P_s"]
    middle = repeats[(len(repeats) - 1) // 2]
    return middle["one_rank_s"], middle["batch_P_s"]


def plot():
    """Draws the figure: one line per workload from one rank to two, the ideal dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs, ceiling = speed_ups()
    fig, ax = plt.subplots(figsize=(5.0, 3.2), dpi=80)
    ax.plot([1, 2], [1, 2], "k--", lw=0.8, label="ideal")
    for label, (one, two) in pairs.items():
        ax.plot([1, 2], [1, one / two], marker="o", label=f"{label}: {one / two:.2f}x")
    ax.plot([2], [ceiling], "k_", ms=14, label=f"ceiling (MLP, two runs at once): {ceiling:.2f}x")
    ax.set(xlabel="ranks (one thread each)", ylabel="speed-up over one rank", xticks=[1, 2])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = atomic_write(DATA / "parallel_scaling.png", lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot())
