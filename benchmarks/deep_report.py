"""The deep benchmark's report (``mnist_deep.py``): a table per depth and the test accuracy
against depth.

``summarise`` turns the runs (``{depth: {method: [one result per seed]}}``) and the chosen
learning rates into the figures over seeds (``common.reports.seed_summary``); ``markdown`` is
the table (test accuracy, its spread, seconds per epoch, peak memory, the learning rate or the
lifted peer's iterations, the certificate); ``plot`` draws the seed means against depth.
"""

import common  # noqa: F401  (puts the repository on the path)
from common import reports
from common.devices import machine
from fenchel_cvx.io import atomic_write
from mnist_lifted import PEERS


def summarise(args, chosen, results, data_desc):
    rows = {}
    for d, by in results.items():
        rows[d] = {}
        for m, planned in by.items():
            runs = [r for r in planned if "not_run" not in r]
            if not runs:
                rows[d][m] = dict(not_run=planned[0]["not_run"], lr=None)
                continue
            per_seed = [
                dict(
                    final_test_accuracy=r["test_accuracy"][-1],
                    test_accuracy=r["test_accuracy"],
                    peak_mib=r["peak_mib"],
                    peak_gpu_mib=r.get("peak_gpu_mib"),
                    seconds_per_epoch=r["seconds"][-1] / len(r["seconds"]),
                )
                for r in runs
            ]
            rows[d][m] = dict(
                reports.seed_summary(per_seed),
                lr=chosen[d].get(m, {}).get("lr"),
                seeds_run=len(runs),
                seeds_planned=len(planned),
            )
            if m == "fln":
                rows[d][m]["certificate"] = [r["certificate"] for r in runs]
    return dict(
        data=data_desc,
        settings=dict(vars(args)),
        machine=machine(args),
        tuning=chosen,
        methods=rows,
        raw=results,
    )


def markdown(summary):
    s = summary["settings"]
    lines = [
        f"MNIST, 784-({s['width']} x depth)-10, {s['activation']}, batch {s['batch_size']}, "
        f"{s['epochs']} epochs, {summary['machine']['threads']} thread(s), seeds "
        f"{s['seed']}..{s['seed'] + s['seeds'] - 1}, the lifted peers "
        f"{s['seed']}..{s['seed'] + s['peer_seeds'] - 1} (means; +- is the spread max - min); "
        f"{summary['data']}",
        "",
        "| depth | method | test acc | s / epoch | peak MiB | lr (validation) | certificate |",
        "|---|---|---|---|---|---|---|",
    ]
    for d, by in summary["methods"].items():
        for m, r in by.items():
            lines.append(row(d, m, r, s["peer_iterations"]))
    lines.append("")
    lines.append(
        "The lifted peers train full-batch: their seconds are per iteration over the whole "
        "training set, and their accuracy is after the iterations named beside them."
    )
    return "\n".join(lines) + "\n"


def row(depth, method, r, peer_iterations):
    """One line of the table."""
    if "not_run" in r:
        return f"| {depth} | {method} | not run: {r['not_run']} | | | | |"
    lr = "" if r["lr"] is None else f"{r['lr']:g}"
    if method in PEERS:
        lr = f"({peer_iterations[method]} iterations)"
    cert = ""
    if "certificate" in r:
        cert = "held" if all(c["violations"] == 0 for c in r["certificate"]) else "violated"
    seeds = r.get("seeds_run", 1) < r.get("seeds_planned", 1)
    seeds = f" ({r['seeds_run']} of {r['seeds_planned']} seeds)" if seeds else ""
    return (
        f"| {depth} | {method} | {r['final_test_accuracy']:.4f} +- "
        f"{r['final_test_accuracy_spread']:.4f}{seeds} | {r['seconds_per_epoch']:.2f} | "
        f"{reports.peak_text(r)} | {lr} | {cert} |"
    )


def plot(summary, path):
    """Test accuracy (seed mean) against depth, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    depths = list(summary["methods"])
    for m in summary["methods"][depths[0]]:
        ran = [d for d in depths if "not_run" not in summary["methods"][d][m]]
        ax.plot(
            ran,
            [summary["methods"][d][m]["final_test_accuracy"] for d in ran],
            marker="o",
            label=m,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("hidden layers")
    ax.set_ylabel("test accuracy")
    ax.set_title(
        f"784-({summary['settings']['width']} x depth)-10, {summary['settings']['activation']}"
    )
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
