"""The benchmarks' reports: figures over seeds, markdown tables, JSON and plots.

Every figure is a mean over seeds (``mean``: None where a seed lacks it), but the seconds to
each accuracy, which are their median (``median``); the final test accuracy also per seed with
its spread (max - min); times are training seconds, evaluation excluded; ``time_to`` is the first
evaluation at or above an accuracy. A method launched several ways (``--methods
adam:t1,adam:t2``) is compared with FLN at its fastest launch (``fastest``). ``write_report`` writes
``results.json``, ``results.md`` and the plot, each through a temporary file.
"""

import json

import numpy as np

from common.devices import machine_text
from common.fln import reads_text
from fenchel_cvx.io import atomic_write, check_writable_dir, write_text

#: the test accuracies whose first reaching the reports time, per method
LEVELS = (0.95, 0.97, 0.98, 0.985)


def time_to(ckpt, target):
    """``(seconds, batches)`` of the first checkpoint at or above ``target`` (None, None: never)."""
    for seen, sec, acc in ckpt:
        if acc >= target:
            return sec, seen
    return None, None


def peak_text(r):
    """A row's peak memory for the tables: the host's max RSS, and the GPU's where one ran."""
    gpu = r.get("peak_gpu_mib")
    return f"{r['peak_mib']:.0f}" + ("" if gpu is None else f" (GPU {gpu:.0f})")


def level_figures(runs):
    """Per run of a launch: seconds to each accuracy of ``LEVELS`` (None where not reached) and
    the seconds its kernels took to compile before the clock (None: not compiled) -> the seeds'
    median seconds and largest compile; with FLN's host reads per unchecked batch and their
    sources (the seed with the most; None: not counted) and the launch (``runner.run_one``:
    its method, ranks and threads)."""
    seconds = [{lvl: time_to(r["checkpoints"], lvl)[0] for lvl in LEVELS} for r in runs]
    compiled = [r.get("compile_seconds") for r in runs]
    reads = [r.get("host_reads_per_batch") for r in runs]
    most = None if None in reads else runs[reads.index(max(reads))]
    return dict(
        seconds_to={lvl: median([s[lvl] for s in seconds]) for lvl in LEVELS},
        compile_seconds=None if None in compiled else max(compiled),
        host_reads_per_batch=None if most is None else most["host_reads_per_batch"],
        host_reads_by_source=None if most is None else most["host_reads_by_source"],
        launch=runs[0].get("launch"),
    )


def method_of(label, row):
    """The method a row's launch ran (``level_figures``' launch; a row without one: its label)."""
    return (row.get("launch") or {}).get("method", label)


def launches(rows, method):
    """The labels of ``rows`` that launched ``method``."""
    return [k for k, r in rows.items() if method_of(k, r) == method]


def fastest(rows, method, figure):
    """``method``'s least ``figure(row)`` over its launches in ``rows`` (None: no launch, or
    none with the figure) and that launch's label."""
    found = [(figure(rows[k]), k) for k in launches(rows, method)]
    found = [(v, k) for v, k in found if v is not None]
    return min(found) if found else (None, None)


def launch_text(rows):
    """Each launch's ranks and threads, for a report's header: ``"fln 2 x 1, adam 1 x 2"``."""
    return ", ".join(
        f"{k} {r['launch']['nproc']} x {r['launch']['threads']}"
        for k, r in rows.items()
        if r.get("launch")
    )


def ratios_over_adam(rows, figure="seconds_per_epoch"):
    """Each FLN launch's ``figure`` over the fastest Adam launch's (the least):
    ``{"FIGURE_FLN_over_ADAM": ratio}`` with the launches' labels, where both have it."""
    adam, label = fastest(rows, "adam", lambda r: r[figure])
    return {
        f"{figure}_{f}_over_{label}": rows[f][figure] / adam
        for f in launches(rows, "fln")
        if adam is not None and rows[f][figure] is not None
    }


def level_table(summary):
    """Markdown: every launch's seconds to each accuracy of ``LEVELS`` (the seeds' median; "n/a":
    not reached by every seed), each FLN launch over the fastest Adam launch to each level, the
    compile's seconds where FLN compiled, FLN's host reads per unchecked batch, and the BLAS
    libraries with the GEMM rates (``machine_text``)."""
    rows = summary["methods"]
    fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    lines = [
        "",
        "Seconds of training to a test accuracy (first evaluation at or above it; the seeds' "
        "median):",
        "",
        "| method | " + " | ".join(f"{lvl:.1%}" for lvl in LEVELS) + " |",
        "|---" * (len(LEVELS) + 1) + "|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | " + " | ".join(fmt(r["seconds_to"][lvl]) for lvl in LEVELS) + " |"
        )
    adam = {
        lvl: fastest(rows, "adam", lambda r, lvl=lvl: r["seconds_to"][lvl])[0] for lvl in LEVELS
    }
    for name in launches(rows, "fln") if launches(rows, "adam") else ():
        f = rows[name]["seconds_to"]
        lines.append(
            f"| {name} / fastest adam | "
            + " | ".join(
                "n/a" if f[lvl] is None or adam[lvl] is None else f"{f[lvl] / adam[lvl]:.2f}"
                for lvl in LEVELS
            )
            + " |"
        )
    for name, r in rows.items():
        if r.get("compile_seconds") is not None:
            lines.append(
                f"\n{name}: kernels compiled in {r['compile_seconds']:.1f} s on the "
                "first two batches (an unchecked and a checked round), before the clock"
            )
        if r.get("host_reads_per_batch") is not None:
            lines.append(
                f"\n{name}: {reads_text(r['host_reads_per_batch'], r['host_reads_by_source'])}"
            )
    lines += ["", machine_text(summary["machine"])]
    return lines


def mean(values):
    """The mean over seeds, or None where a seed lacks the figure (never the others' mean)."""
    return None if any(v is None for v in values) else float(np.mean(values))


def median(values):
    """The median over seeds, or None where a seed lacks the figure."""
    return None if any(v is None for v in values) else float(np.median(values))


def seed_summary(per_seed):
    """The figures both benchmarks report over seeds, from one row per seed: the final test
    accuracy's mean, spread (max - min) and values, the mean accuracy after every epoch and
    seconds per epoch, and the largest peak memory (host, GPU)."""
    acc = [r["final_test_accuracy"] for r in per_seed]
    return dict(
        final_test_accuracy=float(np.mean(acc)),
        final_test_accuracy_spread=float(np.ptp(acc)),
        final_test_accuracy_per_seed=acc,
        test_accuracy=np.mean([r["test_accuracy"] for r in per_seed], axis=0).tolist(),
        seconds_per_epoch=mean([r["seconds_per_epoch"] for r in per_seed]),
        peak_mib=max(r["peak_mib"] for r in per_seed),
        peak_gpu_mib=max(
            (r["peak_gpu_mib"] for r in per_seed if r["peak_gpu_mib"] is not None), default=None
        ),
    )


def plot(summary, path, target=None, ylim=(0.85, 1.0), logx=False, title=None):
    """Test accuracy against batches and against training seconds, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in summary["raw"].items():
        ck = np.array(runs[0]["checkpoints"])  # the first seed's curve
        a1.plot(ck[:, 0], ck[:, 2], marker="." if logx else None, label=name)
        a2.plot(ck[:, 1], ck[:, 2], marker="." if logx else None, label=name)
    for ax, xl in ((a1, "batches"), (a2, "training seconds")):
        if target is not None:
            ax.axhline(target, color="gray", lw=0.8, ls="--")
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(ylim)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))  # never half-written
    plt.close(fig)


def output_folder(args):
    """``--out`` as a folder, created and proven writable before any run starts (a run's report
    must not fail after hours of training); ``p.error``-style exit naming the flag."""
    try:
        return check_writable_dir("--out", args.out)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def write_report(out, summary, table, draw, figure="accuracy.png"):
    """Write ``results.json`` (the summary), ``results.md`` (``table``) and the ``figure``
    (``draw(path)``) to the folder ``out``, and print the table and what was written."""
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "results.json", json.dumps(summary, indent=1, default=str))
    write_text(out / "results.md", table)
    draw(out / figure)
    print(table)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / figure}")
