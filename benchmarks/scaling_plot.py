"""docs/results/parallel_scaling.png: the speed-up of two ranks over one, per workload, beside
the ideal and the machine's ceiling (the docs page "Training in parallel"), read from the
benchmarks' JSON output.

The sources, each a benchmark's JSON copied as written (``RUNS``), all from the 2-core AMD EPYC
VM:

- ``lenet5_eval5_amd_1206f``: ``mnist_lenet5.py --methods fln:r2t1,fln:t1,adam:t1,adam:t2,adam:r2t1
  --eval-every 5`` (seconds per epoch of FLN and of Adam, one rank of one thread against two);
- ``figure1_ranks``: ``figure1_ranks.py`` (Figure 1's FLN round, the median unchecked round);
- ``parallel_model_lenet5_percolumn_r9`` and ``parallel_model_mlp_percolumn``:
  ``parallel_model.py --networks lenet5 --repeats 9`` and ``--networks mlp --repeats 5``
  (LeNet-5's and the MNIST MLP's FLN batch on 4,000 images, the repeat of median speed-up, with
  the ceiling: P one-rank runs at once).

    python benchmarks/scaling_plot.py
"""

import json
from pathlib import Path

from fenchel_cvx.io import atomic_write

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results"
RUNS = (
    "lenet5_eval5_amd_1206f",
    "figure1_ranks",
    "parallel_model_lenet5_percolumn_r9",
    "parallel_model_mlp_percolumn",
)


def load(name):
    return json.loads((DATA / f"{name}.json").read_text())


def speed_ups():
    """``{workload: (one rank's seconds, two ranks')}`` from ``RUNS``, and the ceilings of the
    cost model's networks, ``{network: speed-up}``."""
    lenet = load(RUNS[0])["methods"]
    round_ = load(RUNS[1])
    batches = {"LeNet-5": load(RUNS[2])["lenet5"], "MLP": load(RUNS[3])["mlp"]}
    per_epoch = lambda name: lenet[name]["seconds_per_epoch"]  # noqa: E731
    pairs = {
        "FLN, LeNet-5 (s/epoch)": (per_epoch("fln:t1"), per_epoch("fln:r2t1")),
        "Adam under DDP, LeNet-5 (s/epoch)": (per_epoch("adam:t1"), per_epoch("adam:r2t1")),
        "FLN, Figure 1's round": (round_["one_rank"]["round"], round_["p_ranks"]["round"]),
        **{f"FLN, {name} (s/batch)": median_repeat(run) for name, run in batches.items()},
    }
    return pairs, {name: run["ceiling"]["speedup"] for name, run in batches.items()}


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

    pairs, ceilings = speed_ups()
    fig, ax = plt.subplots(figsize=(5.0, 3.4), dpi=80)
    ax.plot([1, 2], [1, 2], "k--", lw=0.8, label="ideal")
    for label, (one, two) in pairs.items():
        ax.plot([1, 2], [1, one / two], marker="o", label=f"{label}: {one / two:.2f}x")
    for (name, ceiling), colour in zip(ceilings.items(), ("black", "grey")):
        label = f"ceiling ({name}, two runs at once): {ceiling:.2f}x"
        ax.plot([2.06], [ceiling], "_", color=colour, ms=12, mew=2, label=label)  # beside x = 2
    ax.set(xlabel="ranks (one thread each)", ylabel="speed-up over one rank", xticks=[1, 2])
    ax.set_xlim(0.92, 2.12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = atomic_write(DATA / "parallel_scaling.png", lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot())
