"""A screen of FLN's settings on a deep network: which change of the dense setting trains depth.

Each *hypothesis* is a function of the depth that returns a ``deep_plans.Plan``: the per-layer
``defaults.Setting`` (lam of the divergences B_l and rho of the Frobenius penalty, eq. (7) of
the paper; gamma of the batched model's proximal term, eq. (13); momentum; W- and X-steps), the
rounds per batch (alternations, K), the initialisation of the weights and a layer-wise lam
schedule. Every hypothesis changes one thing of the baseline:

- ``baseline``: the dense setting with equal hidden layers (``defaults.Dense.for_layers`` at
  ratio 1: lam 0.2 and gamma 1 on every hidden layer, gamma 30 on the output layer, momentum
  0.7 / 0);
- ``appendix_a``: the variable scaling of the paper's Appendix A. With X^_l = sqrt(lam_{l-1}) X_l
  and W^_l = sqrt(lam_l / lam_{l-1}) W_l (lam_{-1} = 1; the bias scales by sqrt(lam_l)) every
  divergence weighs 1 and the proximal weights become gamma^_l = gamma_l lam_{l-1} / lam_l: at
  depth 1 gamma^ = (1 / 0.2, 30 x 0.2) = (5, 6), nearly balanced; at depth L the dense setting's
  middle layers get gamma^ 1. Balancing them again, gamma_l = gamma_0 / lam_0 = 5 for the hidden
  layers 1..L-1 (equal lam, equal widths);
- ``lam_to_output``, ``lam_to_input``: lam geometric in the layer, x2 a layer toward the output
  (the last hidden layer's 0.2 kept, so the balance of loss and divergences stays), or toward
  the input. By Appendix A a ratio r = lam_l / lam_{l-1} is the gain sqrt(r) on W^_l: r = 2 is
  He's gain over Xavier's for equal widths. X_l's block weighs B_l against B_{l-1} by r, so r > 1
  carries more of the loss's pull back to the input;
- ``lam_gamma_to_output``: ``lam_to_output`` with each hidden layer's gamma_l = 5 lam_l, the
  dense setting's gamma / lam: W_l's block (Hessian lam_l X~_l X~_l^T + gamma_l I) then steps as
  far as in the dense setting (``defaults.Dense.for_layers`` at ratio 2;
  ``lam_gamma_to_output_4``: ratio 4; ``lam_gamma_orthogonal``: ratio 2 and the orthogonal
  initialisation);
- ``he``, ``orthogonal``: the hidden layers' weights drawn with ReLU's gain (``deep_plans.INITS``);
- ``alternations_2``, ``alternations_3``: K rounds per batch (the later rounds start from the
  X of the round before: the only carried-over X that the driver makes);
- ``x_carried``: each X-block's solver starts from the X its columns had at the end of their
  batch an epoch before, where that is the better point of the block (``deep_plans.CarriedX``;
  the feed-forward point otherwise, and in the first epoch);
- ``lam_schedule``: ``lam_to_output``'s profile in epoch 1, ratio sqrt(2) in epoch 2, the dense
  setting's equal lam from epoch 3;
- ``momentum_0``, ``momentum_0.9``: the hidden layers' momentum 0 but W_0's, or 0.9 on all of them;
- ``x_forward``: the ratio-2 setting with the X-sweep from the input forward (X_1, ..., X_L:
  ``fit_bcd(x_sweep="forward")``), each X_l's block seeing the X_{l-1} just solved;
- ``rho_1e-3``, ``rho_1e-2``: the ratio-2 setting with a Frobenius penalty rho ||W_l||^2 on every
  layer (the dense setting has rho 0). By Appendix A, rho_l becomes rho_l lam_{l-1} / lam_l on the
  scaled weights: for a geometric lam, one rho for all layers stays one rho there.

Every run trains on the first 50,000 training images and is scored on the last 10,000
(``common.data``'s rule; the test set is never read), one run at a time, each in its own process.
Writes ``--out``/``deep_screen.json`` (after every run, atomically: each run's validation accuracy
and training seconds per epoch, each layer's divergence B_l after the X-sweep and the relaxation gap
J - F, means over the epoch's checked rounds, and the certificate) and ``deep_screen.md`` (the
table). ``--adam``: first Adam's learning-rate grid on the same split and epochs
(``mnist_deep.tune``), the reference figure. ``--keep``: add to the report in ``--out`` (the same
depth and epochs) instead of starting a new one.

    python benchmarks/deep_screen.py --depth 8 --epochs 3 --adam
    python benchmarks/deep_screen.py --hypotheses baseline,he --quick
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mnist_deep  # noqa: E402
from common.data import add_data_flags, load  # noqa: E402
from common.runner import run_methods  # noqa: E402
from deep_plans import Plan  # noqa: E402
from fenchel_cvx import defaults  # noqa: E402
from fenchel_cvx.io import write_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def scaled_plan(depth, ratio=1.0):
    """The dense setting with equal lam and gamma on every hidden layer (``ratio`` 1, the
    baseline) or scaled by ``ratio`` a layer toward the output (``defaults.Dense.for_layers``)."""
    return Plan(defaults.SETTINGS["dense"].for_layers(depth, ratio))


def _with(plan, **changes):
    """``plan`` with some fields of its setting changed."""
    return dataclasses.replace(plan, setting=dataclasses.replace(plan.setting, **changes))


def _hidden(depth, values, output):
    """One value per hidden layer, then the output layer's."""
    return tuple(values) + (output,) * (depth > 0)


def _geometric(lam, ratio):
    """Per hidden layer ``lam[-1] * ratio^(l - (L - 1))``: the last hidden layer's lam kept."""
    return tuple(lam[-1] * ratio ** (l - (len(lam) - 1)) for l in range(len(lam)))


def appendix_a(depth):
    plan = scaled_plan(depth)
    s = plan.setting
    balanced = s.gamma[0] / s.lam[0]
    gamma = (s.gamma[0],) + (balanced,) * (depth - 1) + (s.gamma[-1],)
    return _with(plan, gamma=gamma)


def lam_to_output(depth):
    plan = scaled_plan(depth)
    return _with(plan, lam=_geometric(plan.setting.lam, 2.0))


def lam_gamma_to_output(depth, ratio=2.0):
    return scaled_plan(depth, ratio)


def rho(value):
    """The ratio-2 setting with ``rho ||W_l||^2`` on every layer (module docstring)."""

    def plan(depth):
        return _with(lam_gamma_to_output(depth), rho=(value,) * (depth + 1))

    return plan


def lam_to_input(depth):
    plan = scaled_plan(depth)
    return _with(plan, lam=_geometric(plan.setting.lam, 0.5))


def lam_schedule(depth):
    plan = lam_to_output(depth)
    uniform = scaled_plan(depth).setting.lam
    return dataclasses.replace(plan, lam_schedule=_lam_decay(uniform))


class _lam_decay:
    """Epoch e + 1's lam: ratio 2^(1/(e + 1)) toward the output up to epoch 2, then ``uniform``
    (a picklable ``Plan.lam_schedule``)."""

    def __init__(self, uniform):
        self.uniform = tuple(uniform)

    def __call__(self, epoch, lam):
        return _geometric(self.uniform, 2.0**0.5) if epoch == 1 else self.uniform


def momentum(value, first=None):
    def plan(depth):
        base = scaled_plan(depth)
        m = base.setting.momentum
        hidden = (m[0] if first is None else first,) + (value,) * (depth - 1)
        return _with(base, momentum=_hidden(depth, hidden, m[-1]))

    return plan


def init(name):
    return lambda depth: dataclasses.replace(scaled_plan(depth), init=name)


def alternations(k):
    return lambda depth: dataclasses.replace(scaled_plan(depth), alternations=k)


#: name -> a function of the depth that returns the ``Plan`` (the baseline first)
HYPOTHESES = {
    "baseline": scaled_plan,
    "appendix_a": appendix_a,
    "lam_to_output": lam_to_output,
    "lam_gamma_to_output": lam_gamma_to_output,
    "lam_gamma_to_output_4": lambda depth: lam_gamma_to_output(depth, 4.0),
    "lam_gamma_to_output_8": lambda depth: lam_gamma_to_output(depth, 8.0),
    "lam_gamma_4_alternations_2": lambda depth: dataclasses.replace(
        lam_gamma_to_output(depth, 4.0), alternations=2
    ),
    "lam_gamma_orthogonal": lambda depth: dataclasses.replace(
        lam_gamma_to_output(depth), init="orthogonal"
    ),
    "lam_to_input": lam_to_input,
    "he": init("he"),
    "orthogonal": init("orthogonal"),
    "alternations_2": alternations(2),
    "alternations_3": alternations(3),
    "x_carried": lambda depth: dataclasses.replace(scaled_plan(depth), carried_x=True),
    "lam_schedule": lam_schedule,
    "momentum_0": momentum(0.0, first=None),
    "momentum_0.9": momentum(0.9, first=0.9),
    "x_forward": lambda depth: dataclasses.replace(lam_gamma_to_output(depth), x_sweep="forward"),
    "rho_1e-3": rho(1e-3),
    "rho_1e-2": rho(1e-2),
}


def describe(plan, base):
    """What ``plan`` changes of the plan ``base``, in words."""
    parts = []
    for field in ("lam", "gamma", "momentum", "rho", "w_steps", "x_steps"):
        mine, theirs = getattr(plan.setting, field), getattr(base.setting, field)
        if mine != theirs:
            parts.append(f"{field} {_values(mine)}")
    if plan.alternations != base.alternations:
        parts.append(f"K = {plan.alternations}")
    if plan.init != base.init:
        parts.append(f"init {plan.init}")
    if plan.lam_schedule is not None:
        parts.append("lam schedule")
    if plan.carried_x:
        parts.append("X carried over from the last epoch")
    if plan.x_sweep != base.x_sweep:
        parts.append(f"the X-sweep {plan.x_sweep}")
    return ", ".join(parts) or "the baseline"


def _values(values):
    if not isinstance(values, tuple):
        return f"{values:g}"
    return "(" + ", ".join(f"{v:.3g}" for v in values) + ")"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--hypotheses",
        default=",".join(HYPOTHESES),
        help=f"a comma list of {', '.join(HYPOTHESES)} (default: all, in that order)",
    )
    p.add_argument("--depth", type=int, default=8, help="hidden layers")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--adam", action="store_true", help="also Adam's grid (mnist_deep.tune)")
    p.add_argument("--quick", action="store_true", help="the embedded 5k MNIST, width 32")
    add_data_flags(p, validation=False, train_size=False)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--check-every", type=int, default=20)
    p.add_argument("--out", default=str(ROOT / "runs" / "deep_screen"))
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the runs of --out's deep_screen.json (the same depth and epochs), add these",
    )
    args = p.parse_args(argv)
    names = args.hypotheses.split(",")
    unknown = [n for n in names if n not in HYPOTHESES]
    if unknown:
        p.error(f"--hypotheses must name {', '.join(HYPOTHESES)}; got {unknown}")
    for name in ("depth", "epochs", "threads", "check_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.hypotheses = names
    return args


def deep_args(args):
    """``mnist_deep``'s arguments of the screen's runs (evaluated at each epoch's end only)."""
    flags = ["--depths", str(args.depth), "--epochs", str(args.epochs), "--methods", "fln,adam"]
    flags += ["--threads", str(args.threads), "--check-every", str(args.check_every)]
    flags += ["--tune-epochs", str(args.epochs), "--eval-every", str(10**9)]
    flags += ["--data-dir", args.data_dir] if args.data_dir else []
    flags += ["--quick"] * args.quick
    return mnist_deep.parse_args(flags)


def validation_size(args):
    return 1000 if args.quick else mnist_deep.VALIDATION


def run_fln(args, ds, batches):
    """``mnist_deep.run_fln`` by the plan of ``args.hypothesis`` (a spawned process's hook)."""
    return mnist_deep.run_fln(args, ds, batches, HYPOTHESES[args.hypothesis](args.depth))


def per_epoch(log, epochs):
    """The relaxation log's means over each epoch's checked rounds: ``(divergences, gap)``,
    a list per epoch (divergences: one per hidden layer); None for an epoch without a checked
    round (``--check-every`` above its batches)."""
    divergences, gaps = [], []
    for e in range(1, epochs + 1):
        rows = [r for r in log if r["epoch"] == e]
        if not rows:
            divergences.append(None)
            gaps.append(None)
            continue
        divergences.append(np.mean([r["divergences"] for r in rows], axis=0).tolist())
        gaps.append(float(np.mean([r["gap"] for r in rows])))
    return divergences, gaps


def screen(args, deep, name):
    """One hypothesis's run on the validation split -> its record."""
    plan = HYPOTHESES[name](args.depth)
    task = mnist_deep.task(deep, "fln", args.depth, validation=validation_size(args))
    task[1].hypothesis = name
    (r,) = run_methods([task], 1, load=load, run_fln=run_fln)
    divergences, gaps = per_epoch(r["relaxation"], args.epochs)
    return dict(
        setting=describe(plan, scaled_plan(args.depth)),
        plan=dict(
            dataclasses.asdict(plan.setting),
            alternations=plan.alternations,
            init=plan.init,
            lam_per_epoch=r["lam_per_epoch"],
        ),
        validation_accuracy=r["test_accuracy"],
        seconds=r["seconds"],
        seconds_per_epoch=r["seconds"][-1] / len(r["seconds"]),
        divergences=divergences,
        gap=gaps,
        certificate=r["certificate"],
        **({"carried_x": r["carried_x"]} if "carried_x" in r else {}),
    )


def adam_reference(args, deep):
    """Adam's grid on the same split and epochs: ``{"grid": {lr: accuracy}, "lr": best}``."""
    deep.methods = "adam"
    return mnist_deep.tune(deep)[args.depth]["adam"]


def markdown(summary):
    s = summary["settings"]
    lines = [
        f"Depth {s['depth']}, width {summary['width']}, ReLU, batch 500, {s['epochs']} epoch(s), "
        f"{s['threads']} thread(s); {summary['data']}. B_l: each hidden layer's divergence after "
        "the X-sweep (X_1's first), J - F: the relaxation gap; both means over the checked "
        "rounds of the last epoch that had one; certificate: its checks but block optimality "
        "(the blocks are solved inexactly by design) on the checked rounds.",
        "",
        "| hypothesis | setting | validation accuracy per epoch | s / epoch | B_l | J - F | "
        "certificate |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["runs"].items():
        acc = ", ".join(f"{a:.4f}" for a in r["validation_accuracy"])
        last = max(e for e, d in enumerate(r["divergences"]) if d is not None)
        div = " ".join(f"{b:.3g}" for b in r["divergences"][last])
        cert = r["certificate"]
        held = ", ".join(cert["by_check"]) + f" violated ({cert['violations']})"
        lines.append(
            f"| {name} | {r['setting']} | {acc} | {r['seconds_per_epoch']:.1f} | {div} | "
            f"{r['gap'][last]:.4g} | {held if cert['violations'] else 'held'} |"
        )
    if summary.get("adam"):
        a = summary["adam"]
        grid = ", ".join(f"{lr:g}: {acc:.4f}" for lr, acc in a["grid"].items())
        lines.append(f"| adam | lr {a['lr']:g} (grid {grid}) | {a['grid'][a['lr']]:.4f} | | | | |")
    return "\n".join(lines) + "\n"


def write(out, summary):
    write_text(out / "deep_screen.json", json.dumps(summary, indent=1, default=str))
    write_text(out / "deep_screen.md", markdown(summary))


def earlier(args, path):
    """The runs and Adam's grid of the screen at ``path`` (``--keep``), checked to be of the same
    depth, epochs and data; ``({}, None)`` without ``--keep``."""
    if not args.keep or not path.exists():
        return {}, None
    try:
        old = json.loads(path.read_text())
        same = {k: old["settings"][k] for k in ("depth", "epochs", "quick")}
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--keep: {path} is not a screen's report ({exc!r})") from None
    if same != {k: getattr(args, k) for k in same}:
        raise SystemExit(f"--keep: {path} is a screen of {same}, not of this run's")
    adam = old.get("adam")
    if adam:  # JSON's keys are text: the grid's learning rates as numbers again
        adam = dict(adam, grid={float(lr): acc for lr, acc in adam["grid"].items()})
    return old["runs"], adam


def main(argv=None):
    args = parse_args(argv)
    deep = deep_args(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, adam = earlier(args, out / "deep_screen.json")
    _, data = load(argparse.Namespace(**{**vars(deep), "validation": validation_size(args)}))
    summary = dict(settings=vars(args), width=deep.width, data=data, runs=runs, adam=adam)
    if args.adam:
        summary["adam"] = adam_reference(args, deep)
        write(out, summary)
    for name in args.hypotheses:
        summary["runs"][name] = screen(args, deep, name)
        write(out, summary)
        print(markdown(summary), flush=True)
    print(f"wrote {out / 'deep_screen.json'}, {out / 'deep_screen.md'}")


if __name__ == "__main__":
    main()
