"""Every generated figure and table of the docs pages and the README, from the benchmarks' JSON.

The MNIST benchmarks (``mnist_mlp.py``, ``mnist_lenet5.py``, ``mnist_lifted.py``,
``mnist_deep.py``) write ``results.json`` to their ``--out`` folder; the runs that the pages
quote are copied, as they were written, to ``docs/results/NAME.json``, and
``tune_baselines.py`` writes ``benchmarks/results/tune_baselines_NETWORK.json``. A run whose
JSON is not in the repository and which the pages quote in more than one place has the figures
they quote transcribed from its printed results.md (or log) into ``docs/results/NAME.json``
(``results_figures.TRANSCRIBED``; its ``"source"`` says so). A page marks each figure or table
that comes from them as a block, ``<!-- generated: NAME -->`` ... ``<!-- /generated -->``:
inline for a figure in a sentence or a table cell, on lines of its own for a table. This
script rewrites every block of docs/*.md and README.md (the tables below, the figures of
``results_figures.py``) and draws ``docs/results/NAME.png``; ``tests/test_results_tables.py``
checks that the committed pages are its output.

    python benchmarks/results_tables.py            # rewrite the blocks (and --plots: the PNGs)
    python benchmarks/results_tables.py --check    # exit 1 if a committed block differs

The paper's figures are the final test accuracies in the captions of its Figures 1-3.
"""

import argparse
import re
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import results_figures as figures  # noqa: E402
from fenchel_cvx.io import atomic_write, write_text  # noqa: E402
from results_figures import NAMES, acc, load, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: the pages whose generated blocks this script fills
PAGES = tuple(sorted((ROOT / "docs").glob("*.md"))) + (ROOT / "README.md",)
#: final test accuracies in the captions of the paper's figures
PAPER = {
    "mlp": {"fln": 0.976, "adam": 0.976, "sgd": 0.943},
    "lenet5": {"fln": 0.990, "adam": 0.989, "sgd": 0.986},
    "lifted": {"taylor": 0.834, "lau": 0.914, "askari": 0.863, "sgd": 0.957, "fln": 0.961},
}
BLOCK = re.compile(r"<!-- generated: ([\w-]+) -->(.*?)<!-- /generated -->", re.S)
OPEN = "<!-- generated:"


def paper_cell(x):
    return "" if x is None else f"{x:.3f}"


def secs(x):
    return "not reached" if x is None else f"{x:.1f}"


def seeds_cell(m):
    n = len(m["final_test_accuracy_per_seed"])
    mean = acc(m["final_test_accuracy"])
    return mean if n == 1 else f"{mean} ± {m['final_test_accuracy_spread']:.4f} ({n} seeds)"


def time_to(m, levels):
    return " / ".join(secs(m["seconds_to"].get(level)) for level in levels)


def figure_table(run, paper, levels):
    """Paper against ours: final accuracy (mean ± spread over seeds), epoch time, time to levels."""
    rows = []
    for key, m in run["methods"].items():
        per_seed = ", ".join(acc(a) for a in m["final_test_accuracy_per_seed"])
        rows.append(
            [
                NAMES[key],
                paper_cell(paper.get(key)),
                seeds_cell(m),
                per_seed,
                f"{m['seconds_per_epoch']:.2f}",
                time_to(m, levels),
            ]
        )
    pct = " / ".join(f"{100 * float(level):g}" for level in levels)
    return table(
        [
            "method",
            "paper",
            "ours: mean ± spread (max − min)",
            "per seed",
            "s / epoch",
            f"s to {pct} % test accuracy",
        ],
        rows,
    )


def curve_table(run):
    """Test accuracy after each epoch, the mean over seeds."""
    epochs = len(next(iter(run["methods"].values()))["test_accuracy"])
    rows = [[NAMES[k]] + [acc(a) for a in m["test_accuracy"]] for k, m in run["methods"].items()]
    return table(["epoch"] + [str(e + 1) for e in range(epochs)], rows)


def table_mlp():
    return figure_table(load("mlp_seeds3"), PAPER["mlp"], ("0.95", "0.97"))


def table_mlp_epochs():
    return curve_table(load("mlp_seeds3"))


def table_lenet5():
    """Figure 3's five seeds (transcribed: ``lenet5_seeds5.json``); SGD ran seed 0 alone."""
    rows = []
    for key, m in figures.transcribed("lenet5_seeds5")["methods"].items():
        seeds, two = m["final_test_accuracy_per_seed"], m["after_2_epochs"]
        of = m.get("final_test_accuracy_of")
        rows.append(
            [
                NAMES[key],
                paper_cell(PAPER["lenet5"].get(key)),
                figures.spread(m) + (f" ({of})" if of else ""),
                ", ".join(acc(a) for a in seeds) if len(seeds) > 1 else "",
                acc(two["test_accuracy"])
                + (f" ({two['of']})" if len(seeds) > 1 and two["of"] == "seed 0" else ""),
                f"{m['seconds_per_epoch_seed_0']:.2f}",
            ]
        )
    head = ["method", "paper", "ours after 20 epochs: mean ± spread", "per seed (0-4)"]
    return table(head + ["after 2 epochs", "s / epoch (seed 0)"], rows)


def table_lenet5_short():
    rows = []
    for name in ("lenet_eager_t1", "adam_lenet_t1"):
        run = load(name)
        for key, m in run["methods"].items():
            rows.append(
                [
                    NAMES[key],
                    run["settings"]["epochs"],
                    " / ".join(acc(a) for a in m["test_accuracy"][:3]),
                    " / ".join(
                        acc(m["accuracy_at_batches"].get(b)) for b in ("1", "5", "20", "100")
                    ),
                    f"{m['seconds_per_epoch']:.2f}",
                    time_to(m, ("0.95", "0.97", "0.98", "0.985")),
                ]
            )
    return table(
        [
            "method",
            "epochs run",
            "test acc. after epochs 1 / 2 / 3",
            "after batches 1 / 5 / 20 / 100",
            "s / epoch",
            "s to 95 / 97 / 98 / 98.5 %",
        ],
        rows,
    )


COMPILED_RUNS = [
    ("mlp", 1, "mlp_eager_t1"),
    ("mlp", 1, "mlp_comp_t1"),
    ("mlp", 2, "mlp_eager_t2"),
    ("mlp", 2, "mlp_comp_t2"),
    ("mlp", 2, "mlp_comp_t2_rerun"),
    ("lenet5", 1, "lenet_eager_t1"),
    ("lenet5", 1, "lenet_comp_t1"),
    ("lenet5", 2, "lenet_eager_t2"),
    ("lenet5", 2, "lenet_eager_t2_rerun"),
    ("lenet5", 2, "lenet_comp_t2"),
    ("lenet5", 2, "lenet_comp_t2_rerun"),
]
ADAM_RUNS = {
    ("mlp", 1): "adam_mlp_t1",
    ("mlp", 2): "adam_mlp_t2",
    ("lenet5", 1): "adam_lenet_t1",
    ("lenet5", 2): "adam_lenet_t2",
}


def table_compiled():
    """FLN's eager and compiled paths, 3 epochs each, beside Adam's run on as many threads."""
    rows = []
    for net, threads, name in COMPILED_RUNS:
        run = load(name)
        assert run["settings"]["threads"] == threads, name
        fln = run["methods"]["fln"]
        adam = load(ADAM_RUNS[net, threads])["methods"]["adam"]
        path = "compiled" if run["settings"].get("compile") else "eager"
        compile_s = fln.get("compile_seconds")
        rows.append(
            [
                "MLP 784-300-10" if net == "mlp" else "LeNet-5",
                threads,
                path,
                acc(fln["final_test_accuracy"]),
                f"{fln['seconds_per_epoch']:.2f}",
                f"{fln['seconds_per_epoch'] / adam['seconds_per_epoch']:.2f}",
                time_to(fln, ("0.95", "0.97", "0.98", "0.985")),
                "" if compile_s is None else f"{compile_s:.1f}",
                f"`{name}`",
            ]
        )
    return table(
        [
            "network",
            "threads",
            "FLN path",
            "test acc. after 3 epochs",
            "s / epoch",
            "÷ Adam's s / epoch (reference run)",
            "s to 95 / 97 / 98 / 98.5 %",
            "compile s",
            "run (docs/results/)",
        ],
        rows,
    )


def table_adam_reference():
    rows = []
    for (net, threads), name in ADAM_RUNS.items():
        run = load(name)
        m = run["methods"]["adam"]
        rows.append(
            [
                "MLP 784-300-10" if net == "mlp" else "LeNet-5",
                threads,
                run["settings"]["epochs"],
                acc(m["final_test_accuracy"]),
                f"{m['seconds_per_epoch']:.2f}",
                time_to(m, ("0.95", "0.97", "0.98", "0.985")),
            ]
        )
    return table(
        [
            "network",
            "threads",
            "epochs",
            "Adam's test acc.",
            "s / epoch",
            "s to 95 / 97 / 98 / 98.5 %",
        ],
        rows,
    )


def table_lifted_rounds():
    run = load("lifted_rounds")
    rows = [
        [
            NAMES[k],
            paper_cell(PAPER["lifted"].get(k)),
            m["iterations"],
            acc(m["final_test_accuracy"]),
            f"{m['seconds_per_iteration']:.2f}",
            f"{m['train_seconds']:.1f}",
        ]
        for k, m in run["methods"].items()
    ]
    return table(
        ["method", "paper (final)", "iterations run", "test acc.", "s / iteration", "train s"], rows
    )


def table_deep_screen_last():
    """The depth-8 screen on the last 10,000 (``deep_screen_last_d8.json``), each hypothesis
    beside its third epoch on the permutation split (``deep_screen.json``)."""
    last, perm = (figures.load_screen_report(8, kept) for kept in (True, False))
    rows = []
    for name, run in last["runs"].items():
        bad = run["certificate"]["violations"]
        before = perm["runs"].get(name, {}).get("validation_accuracy", [None])[-1]
        curve = [acc(a) for a in run["validation_accuracy"]]
        rows.append([f"`{name}`", *curve, acc(before), f"{bad} violations" if bad else "held"])
    a, b = last["adam"], perm["adam"]
    adam = f"{acc(a['grid'][str(a['lr'])])} (lr {a['lr']:g})"
    rows.append(["Adam", "", "", adam, acc(b["grid"][str(b["lr"])]), ""])
    head = ["hypothesis", "epoch 1", "epoch 2", "epoch 3", "permutation split, ep. 3", "cert."]
    return table(head, rows)


TABLES = {
    "deep_screen_last": table_deep_screen_last,
    "mlp": table_mlp,
    "mlp_epochs": table_mlp_epochs,
    "lenet5": table_lenet5,
    "lenet5_short": table_lenet5_short,
    "compiled": table_compiled,
    "adam_reference": table_adam_reference,
    "lifted_rounds": table_lifted_rounds,
}
#: the plot of each experiment: the runs it draws, and the lowest accuracy it shows
PLOTS = {
    "mlp": (["mlp_seeds3"], 0.8),
    "lenet5_short": (["lenet_eager_t1", "adam_lenet_t1"], 0.8),
    "lifted_rounds": (["lifted_rounds"], 0.5),
}


def block(name):
    """The text between a block's markers: a table on lines of its own, a figure inline."""
    text = TABLES[name]() if name in TABLES else figures.figure(name)
    return "\n" + text if text.endswith("\n") else text


def known(name):
    return name in TABLES or figures.known(name)


def render(text, page="the page"):
    """``text`` with every generated block filled; an unknown name or an unclosed block is an
    error that names the page."""
    if text.count(OPEN) != len(BLOCK.findall(text)):
        raise ValueError(f"{page}: a '{OPEN} NAME -->' without its '<!-- /generated -->'")

    def fill(match):
        name = match.group(1)
        if not known(name):
            raise KeyError(f"{page} names a generated block {name!r}, which is no table or figure")
        return f"<!-- generated: {name} -->{block(name)}<!-- /generated -->"

    return BLOCK.sub(fill, text)


def _curves(run):
    """(label, seconds, accuracy) of each method of a run: seed 0's checkpoints or records."""
    for key, raw in run["raw"].items():
        if isinstance(raw, list):  # the MNIST benchmarks: one entry per seed
            points = [(0.0, raw[0]["initial_test_accuracy"])] + [
                (s, a) for _, s, a in raw[0]["checkpoints"]
            ]
            points += list(zip(raw[0]["seconds"], raw[0]["test_accuracy"]))
        else:  # mnist_lifted.py: one LiftedRun per method
            points = [(0.0, raw["initial_test_accuracy"])] + [
                (r["seconds"], r["test_accuracy"]) for r in raw["records"]
            ]
        points.sort()
        yield NAMES[key], [p[0] for p in points], [p[1] for p in points]


def plot(name):
    """docs/results/NAME.png: test accuracy against training seconds, seed 0 of each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.0), dpi=80)
    runs, lowest = PLOTS[name]
    for run_name in runs:
        for label, seconds, accuracy in _curves(load(run_name)):
            ax.plot(seconds, accuracy, label=label)
    ax.set(xlabel="training seconds", ylabel="test accuracy", ylim=(lowest, 1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = atomic_write(figures.DATA / f"{name}.png", lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed block differs")
    parser.add_argument("--plots", action="store_true", help="also draw docs/results/*.png")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = render(text, page.name)
        if new != text:
            stale.append(page)
            if not args.check:
                write_text(page, new)
    if args.check:
        for page in stale:
            name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
            print(f"{name}: a generated block differs; run python benchmarks/results_tables.py")
        return 1 if stale else 0
    if args.plots:
        for name in PLOTS:
            print(plot(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
