"""The figures that the docs pages and the README quote, read from the benchmarks' JSON output.

A page marks each quoted figure or table as a block, ``<!-- generated: NAME -->`` ... ``<!--
/generated -->``: inside a sentence or a table cell for a figure, on lines of their own for a
table. ``results_tables.py`` fills every block of every page from ``figure(NAME)`` (its own
tables of docs/results.md included) and ``tests/test_results_tables.py`` checks that the
committed pages are its output, so a figure quoted on several pages is the same everywhere and is
the JSON's. The sources:

- ``docs/results/NAME.json``: the runs quoted on the pages Results and Deep networks, each the
  ``results.json`` its benchmark wrote to ``--out``, copied as written;
- ``benchmarks/results/tune_baselines_NETWORK.json``: ``tune_baselines.py``'s learning-rate
  screens of the backprop baselines (the page Tuning);
- ``docs/results/NAME.json`` of ``TRANSCRIBED``: runs whose own JSON is not in the repository,
  each holding the figures the pages quote, transcribed from the run's printed results.md or
  log (its ``"source"`` says which), with its command, machine and date as the pages state them.

Names are either keys of ``FIGURES`` or match one of ``PATTERNS`` (``deep_8_fln``: FLN's test
accuracy at 8 hidden layers in ``deep_final.json``; ``lenet5_seeds5-fln``: FLN's mean ± spread
in the transcribed ``lenet5_seeds5.json``; ``screen_16_lam_gamma_to_output_4_ep2``: that
hypothesis's validation accuracy after epoch 2 in ``deep_screen_d16.json``).
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results"
SCREENS = ROOT / "benchmarks" / "results"
NAMES = {
    "fln": "FLN",
    "adam": "Adam",
    "sgd": "SGD",
    "lau": "Lau et al. (proximal BCD)",
    "taylor": "Taylor et al. (ADMM)",
    "askari": "Askari et al. (lifted networks)",
}
SHORT = {**NAMES, "lau": "Lau et al.", "taylor": "Taylor et al.", "askari": "Askari et al."}


def _read(path, keys, what):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not all(k in data for k in keys):
        raise ValueError(f"{path} is not {what} (no {' or '.join(repr(k) for k in keys)})")
    return data


def load(name):
    """One run's results.json, as the benchmark wrote it (``docs/results/NAME.json``)."""
    return _read(DATA / f"{name}.json", ("methods", "settings"), "a benchmark's results.json")


def load_screen(network):
    """``tune_baselines.py``'s report for ``network`` (``mlp`` or ``lenet5``)."""
    path = SCREENS / f"tune_baselines_{network}.json"
    return _read(path, ("chosen", "runs"), "a tune_baselines.py report")


def acc(x):
    return "n/a" if x is None else f"{x:.4f}"


def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(head, rows):
    return "\n".join([row(head), row(["---"] * len(head))] + [row(r) for r in rows]) + "\n"


def spread(m):
    """``mean ± spread`` over the seeds (max − min), or the one seed's accuracy."""
    if len(m.get("final_test_accuracy_per_seed", ())) == 1:
        return acc(m["final_test_accuracy"])
    return f"{acc(m['final_test_accuracy'])} ± {m['final_test_accuracy_spread']:.4f}"


def rate(x):
    return f"{x:g}"


# --- Figures 1 and 2 (docs/results/lifted_rounds.json, mlp_seeds3.json) ------------------------
def _lifted(key):
    return load("lifted_rounds")["methods"][key]


def _mlp(key):
    return load("mlp_seeds3")["methods"][key]


def _certificate(m):
    """The checked rounds of each seed and the violations over all seeds."""
    checked = {c["checked"] for c in m["certificate"]}
    rounds = {c["rounds"] for c in m["certificate"]}
    violations = sum(c["violations"] for c in m["certificate"])
    each = "/".join(str(n) for n in sorted(checked))
    of = "/".join(f"{n:,}" for n in sorted(rounds))
    held = "no violation" if violations == 0 else f"{violations} violations"
    return f"{each} of each seed's {of} rounds checked, {held}"


# --- the backprop baselines' screens (benchmarks/results/tune_baselines_*.json) ---------------
def chosen_rates(network):
    """The learning rates chosen on the validation split, as the pages name them."""
    screen = load_screen(network)
    lr = screen["chosen"]
    return (
        f"Adam {rate(lr['adam'])}, SGD {rate(lr['sgd'])}, SGD with momentum "
        f"{rate(screen['momentum'])} at {rate(lr['sgd_momentum'])}"
    )


def screen_table(network, setting):
    """Validation accuracy after epochs 1, 2, 5 and 10 of each rate, the chosen one in bold."""
    screen = load_screen(network)
    chosen = screen["chosen"][setting]
    rows = []
    for run in screen["runs"]:
        if run["setting"] != setting:
            continue
        curve = run["validation_accuracy"]
        cells = [acc(curve[e - 1]) if e <= len(curve) else "" for e in (1, 2, 5, 10)]
        label = rate(run["lr"])
        if run["lr"] == chosen:
            label, cells[-1] = f"**{label}** (chosen)", f"**{cells[-1]}**"
        rows.append([label] + cells)
    return table(["learning rate", "ep 1", "ep 2", "ep 5", "ep 10"], rows)


# --- Deep networks (docs/results/deep_final.json, deep_test_d8.json) ---------------------------
def _deep(depth, key):
    return load("deep_final")["methods"][str(depth)][key]


def _gap(depth):
    """Adam's test accuracy above FLN's, in points."""
    return 100 * (
        _deep(depth, "adam")["final_test_accuracy"] - _deep(depth, "fln")["final_test_accuracy"]
    )


def deep_table():
    """Test accuracy after the run's epochs at every depth and method, and what each cost."""
    run = load("deep_final")
    iterations = run["settings"].get("peer_iterations", {})
    rows = []
    for depth, methods in run["methods"].items():
        for key, m in methods.items():
            if key in iterations:
                lr = f"({iterations[key]} iterations)"
            else:
                lr = "" if m.get("lr") is None else rate(m["lr"])
            cert = m.get("certificate") or []
            held = "" if not cert else "violated" if any(c["violations"] for c in cert) else "held"
            rows.append(
                [
                    depth,
                    SHORT[key],
                    spread(m),
                    f"{m['seconds_per_epoch']:.2f}",
                    f"{m['peak_mib']:.0f}",
                    lr,
                    held,
                ]
            )
    head = ["hidden layers", "method", "test acc.", "s / epoch", "peak MiB", "lr", "certificate"]
    return table(head, rows)


def deep_rates_table():
    """The baselines' learning rate chosen per depth on the validation split, and its grid."""
    rows = []
    for depth, tuned in load("deep_final")["tuning"].items():
        cells = [depth]
        for key in ("adam", "sgd"):
            grid = tuned[key]["grid"]
            best = tuned[key]["lr"]
            cells.append(f"{rate(best)} ({acc(grid[str(float(best))])})")
            cells.append(", ".join(f"{rate(float(lr))}: {acc(a)}" for lr, a in grid.items()))
        rows.append(cells)
    head = ["hidden layers", "Adam: lr (validation)", "grid", "SGD: lr (validation)", "grid"]
    return table(head, rows)


DEEP_TEST_EPOCHS = (1, 2, 3, 5, 8, 10)


def _deep_test(key):
    return load("deep_test_d8")["methods"]["8"][key]


def deep_test_table():
    """Depth 8 on the test set: FLN in the dense setting of that depth against Adam."""
    methods = load("deep_test_d8")["methods"]["8"]
    rows = []
    for key, m in methods.items():
        curve = [acc(m["test_accuracy"][e - 1]) for e in DEEP_TEST_EPOCHS]
        curve[-1] = f"**{curve[-1]}**"
        label = "FLN, ratio 2" if key == "fln" else f"{SHORT[key]}, lr {rate(m['lr'])}"
        rows.append([label] + curve + [f"{m['seconds_per_epoch']:.1f}", f"{m['peak_mib']:.0f}"])
    head = ["method"] + [f"ep {e}" for e in DEEP_TEST_EPOCHS] + ["s / epoch", "peak MiB"]
    return table(head, rows)


def _deep_validation(depth, key):
    """The validation accuracy of the rate chosen for ``key`` at ``depth``."""
    tuned = load("deep_final")["tuning"][str(depth)][key]
    return acc(tuned["grid"][str(float(tuned["lr"]))])


def _deep_epochs(depth, key, epochs):
    curve = _deep(depth, key)["test_accuracy"]
    return ", ".join(acc(curve[e - 1]) for e in epochs)


# --- runs whose own JSON is not in the repository (docs/results/NAME.json, transcribed) -------
#: the transcribed runs (and one screen's table), each quoted on more than one page or place
TRANSCRIBED = tuple(
    "lenet5_seeds5 lenet5_seeds5_compiled mlp_sgd_paper_lr mlp_tuned_lr lenet5_tuned_lr"
    " deep_16_ratio2 digits lenet5_rho20 lifted_full".split()
)


def transcribed(name):
    """A transcribed run's figures, refused unless its ``source`` says it is a transcription."""
    keys = ("source", "command", "machine", "date", "settings")
    data = _read(DATA / f"{name}.json", keys, "a transcribed run")
    if not data["source"].startswith("transcribed from the run"):
        raise ValueError(f"{name}.json: its source is no transcription: {data['source']!r}")
    return data


def run_figure(name, key, field=None):
    """``NAME-KEY``: a method's mean ± spread; ``-seeds`` each seed's, ``-range`` their lowest and
    highest, ``-acc`` the mean alone, ``-b20`` the accuracy after 20 batches."""
    m = transcribed(name)["methods"][key]
    seeds = m.get("final_test_accuracy_per_seed", [])
    if field == "seeds":
        return ", ".join(map(acc, seeds))
    if field == "range":
        return f"{acc(min(seeds))}-{acc(max(seeds))}"
    if field == "acc":
        return acc(m["final_test_accuracy"])
    return acc(m["accuracy_at_batches"][field[1:]]) if field else spread(m)


def rho20_table():
    """The output layer's Frobenius penalty over twenty epochs (docs/tuning.md), chosen in bold."""
    screen = transcribed("lenet5_rho20")
    rows = []
    for run in screen["runs"].values():
        curve, label, best = [acc(a) for a in run["validation_accuracy"]], run["label"], run["best"]
        if run.get("chosen"):
            label, curve[-1] = f"**{label}**", f"**{curve[-1]}**"
        rows.append([label, *curve, f"{acc(best['validation_accuracy'])} ({best['epoch']})"])
    head = ["rho of W_4"] + [f"ep {e}" for e in screen["settings"]["epochs"]] + ["best"]
    return table(head, rows)


def _rho20(rho):
    return acc(transcribed("lenet5_rho20")["runs"][rho]["validation_accuracy"][-1])


# --- the deep screens (docs/results/deep_screen*.json: deep_screen.py's reports) ---------------
#: the ratios of lam and gamma a layer screened at each depth: the page's column, the hypothesis
RATIOS = {
    "equal lam and gamma": "baseline",
    "x2 a layer toward the output": "lam_gamma_to_output",
    "x4 a layer": "lam_gamma_to_output_4",
}


def load_screen_report(depth, last=False):
    """``deep_screen.py``'s report at ``depth`` (8: ``deep_screen.json``); ``last``: its
    screen validated on the last 10,000 training images (``deep_screen_last_dD.json``)."""
    name = "deep_screen" if int(depth) == 8 else f"deep_screen_d{depth}"
    name = f"deep_screen_last_d{depth}" if last else name
    return _read(DATA / f"{name}.json", ("settings", "runs"), "a deep_screen.py report")


def screen_curve(depth, hypothesis, epoch=None, sep=", "):
    """A hypothesis's validation accuracy after each epoch (or after ``epoch``)."""
    curve = load_screen_report(depth)["runs"][hypothesis]["validation_accuracy"]
    return acc(curve[int(epoch) - 1]) if epoch else sep.join(acc(a) for a in curve)


def screen_adam(depth, best_only=False):
    """Adam's reference of a screen: its rate, the grid's best, and the grid."""
    adam = load_screen_report(depth)["adam"]
    best = next(a for lr, a in adam["grid"].items() if float(lr) == adam["lr"])
    grid = ", ".join(f"{rate(float(lr))}: {acc(a)}" for lr, a in adam["grid"].items())
    return acc(best) if best_only else f"lr {rate(adam['lr'])}, the best of {grid}"


def deep_ratios_table(last=False):
    """The ratios screened at each depth: validation accuracy after each epoch, the best bold;
    ``last``: the screens validated on the last 10,000, with Adam's grid's best beside them."""
    rows = []
    screened_last = sorted(
        int(p.stem.rpartition("_d")[2]) for p in DATA.glob("deep_screen_last_d*")
    )
    for depth in screened_last if last else (2, 4, 8, 9, 10, 11, 12, 16):
        report = load_screen_report(depth, last)
        runs = report["runs"]
        screened = [h for h in RATIOS.values() if h in runs]
        curves = {h: list(map(acc, runs[h]["validation_accuracy"])) for h in screened}
        best = max(curves, key=lambda h: runs[h]["validation_accuracy"][-1])
        curves[best][-1] = f"**{curves[best][-1]}**"
        row = [depth] + [", ".join(curves.get(h, [])) for h in RATIOS.values()]
        if last:
            adam = report["adam"]
            row.append(f"{acc(max(adam['grid'].values()))} (lr {rate(adam['lr'])})")
        rows.append(row)
    return table(["hidden layers", *RATIOS] + (["Adam"] if last else []), rows)


FIGURES = {
    "fig1_fln": lambda: acc(_lifted("fln")["final_test_accuracy"]),
    "fig1_askari": lambda: acc(_lifted("askari")["final_test_accuracy"]),
    "fig1_fln_round": lambda: f"{_lifted('fln')['seconds_per_iteration']:.2f}",
    "fig1_lau_round": lambda: f"{_lifted('lau')['seconds_per_iteration']:.2f}",
    "fig1_round_ratio": lambda: (
        f"{_lifted('fln')['seconds_per_iteration'] / _lifted('lau')['seconds_per_iteration']:.2f}"
    ),
    "fig2_fln": lambda: spread(_mlp("fln")),
    "fig2_adam": lambda: spread(_mlp("adam")),
    "fig2_epoch_ratio": lambda: (
        f"{load('mlp_seeds3')['ratios']['seconds_per_epoch_fln_over_adam']:.1f}"
    ),
    "fig2_time97_ratio": lambda: f"{load('mlp_seeds3')['ratios']['time_to_97_fln_over_adam']:.1f}",
    "fig2_fln_batches97": lambda: f"{_mlp('fln')['batches_to_97']:.0f}",
    "fig2_adam_batches97": lambda: f"{_mlp('adam')['batches_to_97']:.0f}",
    "fig2_fln_gflop": lambda: f"{_mlp('fln')['gflop_per_batch']:.2f}",
    "fig2_adam_gflop": lambda: f"{_mlp('adam')['gflop_per_batch']:.2f}",
    "fig2_certificate": lambda: _certificate(_mlp("fln")),
    "fig2_min_gap": lambda: f"{min(c['min_bound_gap'] for c in _mlp('fln')['certificate']):.3f}",
    "lr_mlp": lambda: chosen_rates("mlp"),
    "lr_lenet5": lambda: chosen_rates("lenet5"),
    "tune_mlp_sgd": lambda: screen_table("mlp", "sgd"),
    "tune_mlp_sgd_momentum": lambda: screen_table("mlp", "sgd_momentum"),
    "tune_mlp_adam": lambda: screen_table("mlp", "adam"),
    "tune_lenet5_sgd": lambda: screen_table("lenet5", "sgd"),
    "tune_lenet5_sgd_momentum": lambda: screen_table("lenet5", "sgd_momentum"),
    "tune_lenet5_adam": lambda: screen_table("lenet5", "adam"),
    "deep_final": deep_table,
    "deep_rates": deep_rates_table,
    "deep_test_d8": deep_test_table,
    "deep_test_d8_fln_ep3": lambda: acc(_deep_test("fln")["test_accuracy"][2]),
    "deep_16_fln_epochs": lambda: _deep_epochs(16, "fln", (1, 2, 3, 5, 10)),
    "deep_gap_shallow": lambda: f"{max(abs(_gap(1)), abs(_gap(2))):.1f}",
    "deep_ratios": deep_ratios_table,
    "deep_ratios_last": lambda: deep_ratios_table(last=True),
    "lenet5_rho20": rho20_table,
    "lenet5_rho20_chosen": lambda: _rho20("0.3"),
    "lenet5_rho20_none": lambda: _rho20("0"),
}
#: seed 0's accuracy after N batches in Figure 3's time-to-accuracy runs (``lenet5_short``)
SHORT_RUNS = {"fln": "lenet_eager_t1", "adam": "adam_lenet_t1"}
#: figures of deep_final.json by depth and method: ``deep_8_fln`` (mean ± spread, or the one
#: seed's), ``deep_8_fln_acc`` (the mean alone), ``deep_8_fln_seeds`` (each seed's),
#: ``deep_gap_8`` (Adam's test accuracy above FLN's, in points)
PATTERNS = (
    (re.compile(r"deep_(\d+)_([a-z]+)"), lambda d, k: spread(_deep(d, k))),
    (re.compile(r"deep_(\d+)_([a-z]+)_acc"), lambda d, k: acc(_deep(d, k)["final_test_accuracy"])),
    (
        re.compile(r"deep_(\d+)_([a-z]+)_seeds"),
        lambda d, k: ", ".join(acc(a) for a in _deep(d, k)["final_test_accuracy_per_seed"]),
    ),
    (re.compile(r"deep_gap_(\d+)"), lambda d: f"{_gap(d):.1f}"),
    (re.compile(r"deep_(\d+)_([a-z]+)_val"), _deep_validation),
    (re.compile(rf"({'|'.join(TRANSCRIBED)})-([a-z_]+?)(?:-(seeds|range|acc|b\d+))?"), run_figure),
    (re.compile(r"screen_(\d+)_adam"), screen_adam),
    (re.compile(r"screen_(\d+)_adam_acc"), lambda d: screen_adam(d, best_only=True)),
    (re.compile(r"screen_(\d+)_([a-z0-9_]+?)_ep(\d)"), screen_curve),
    (re.compile(r"screen_(\d+)_([a-z0-9_]+?)_cells"), lambda d, h: screen_curve(d, h, sep=" | ")),
    (re.compile(r"screen_(\d+)_([a-z0-9_]+)"), screen_curve),
    (
        re.compile(r"lenet5_short_(fln|adam)_b(\d+)"),
        lambda k, n: acc(load(SHORT_RUNS[k])["methods"][k]["accuracy_at_batches"][n]),
    ),
)


def known(name):
    """Whether ``name`` is a figure of ``FIGURES`` or of ``PATTERNS``."""
    return name in FIGURES or any(p.fullmatch(name) for p, _ in PATTERNS)


def figure(name):
    """The text of the block ``name``: a figure (one line) or a table (ending in a newline)."""
    if name in FIGURES:
        return FIGURES[name]()
    for pattern, make in PATTERNS:
        match = pattern.fullmatch(name)
        if match:
            return make(*match.groups())
    raise KeyError(name)
