# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · The four blocks as CVXPY problems
#
# **What it teaches.** Fixing all but one variable, the lifted objective (the paper's eq. (7))
#
# $$F(W, X) = L(Y, W_L \tilde X_L) + \sum_l \rho_l \|W_l\|_F^2 + \sum_{l<L} \lambda_l B_l(X_{l+1}, W_l \tilde X_l)$$
#
# is convex in that variable (Theorem 1: each $B_l$ is convex in each argument). The paper's block
# coordinate descent (Section 4.5, Algorithm 1) solves four kinds of convex blocks:
#
# | block | problem |
# |---|---|
# | $X_l$, hidden ($l<L$) | $\min_Z \lambda_{l-1} B_{l-1}(Z, U_{l-1}) + \lambda_l B_l(X_{l+1}, W_l [Z; 1])$ |
# | $X_L$, last | $\min_Z L(Y, W_L [Z;1]) + \lambda_{L-1} B_{L-1}(Z, U_{L-1})$ |
# | $W_l$, hidden | $\min_W \lambda_l B_l(X_{l+1}, W \tilde X_l) + \rho_l \|W\|^2 + \gamma_l \|W - W_l^0\|^2$ |
# | $W_L$, last | $\min_W L(Y, W \tilde X_L) + \rho_L \|W\|^2 + \gamma_L \|W - W_L^0\|^2$ |
#
# Here we write each block of a tiny network out as an explicit CVXPY problem
# (`fenchel_cvx.oracle.block_problem`), print it, solve it with CVXPY (Clarabel), and check it
# against the oracle backend (which solves the same block by compiled DPP templates, then polishes
# the solver's point with Newton steps on the block's own objective). For MSE with ReLU the last
# $X$-block is a **nonnegative least squares** problem, solved by `scipy.optimize.nnls`; we compare
# it with CVXPY.
#
# **Running it.** By default the notebook runs small sizes, in under a minute on one core. The
# outputs shown here come from its full sizes: set `FENCHEL_NOTEBOOK_FULL=1` in the environment
# of the kernel (for example `FENCHEL_NOTEBOOK_FULL=1 jupyter lab`) to run those.

# %%
# %matplotlib inline
import os
import time

import matplotlib.pyplot as plt
import numpy as np

FULL = os.environ.get("FENCHEL_NOTEBOOK_FULL", "0") not in ("", "0")  # the sizes of the saved outputs
SMALL = not FULL  # the default: small sizes, under a minute
print("full settings" if FULL else "small settings")

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
net

# %% [markdown]
# ## Each block, printed and solved
#
# `block_problem(block)` returns the whole block with NumPy data. Its optimal value *is* the block's
# objective (the part of $F$ that depends on the variable, constants included), so it must equal the
# oracle's `BlockResult.value`, and the two minimisers must agree.

# %%
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
    print()

# %%
print(f"{'block':42s} {'CVXPY value':>13s} {'oracle value':>13s} {'max |dZ|':>9s} "
      f"{'KKT CVXPY':>10s} {'KKT oracle':>10s}  oracle's solver")
for name, v_cvx, v_or, dz, kkt_cvx, kkt, solver in rows:
    print(f"{name:42s} {v_cvx:13.8f} {v_or:13.8f} {dz:9.1e} {kkt_cvx:10.1e} {kkt:10.1e}  {solver}")
    assert abs(v_cvx - v_or) <= 1e-6 * (1 + abs(v_cvx))

# %% [markdown]
# ## One BCD round by hand
#
# Solving the blocks in the driver's order ($X_L, \dots, X_1$ then $W_L, \dots, W_0$) never raises
# $F$: each step is an exact minimisation of $F$ over one block.

# %%
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
plt.show()

# %% [markdown]
# ## Nonnegative least squares for the MSE + ReLU last block
#
# With $L = \|Y - W_L \tilde X_L\|^2$ and ReLU, $\lambda B(z, u) = \tfrac\lambda2 \|z - u\|^2$ + const on
# $z \ge 0$, so column by column
#
# $$\min_{z \ge 0} \Big\| \begin{bmatrix} W_x \\ \sqrt{\lambda/2}\, I \end{bmatrix} z -
# \begin{bmatrix} y_j - b \\ \sqrt{\lambda/2}\, u_j \end{bmatrix} \Big\|^2 ,$$
#
# a nonnegative least squares problem that an active-set method solves exactly. Below: the same
# block by `scipy.optimize.nnls` and by CVXPY, side by side, on a wider layer.

# %%
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
plt.show()

# %% [markdown]
# ## Other activations and cross-entropy
#
# Sigmoid and tanh divergences involve entropies and log-sum-exp, cross-entropy a log-sum-exp: the
# blocks become exponential-cone programs. An interior-point solver stops on its duality gap, so a
# plain CVXPY solve can report `optimal` and still be some way from the minimiser. The KKT residual
# (`blocks.kkt_residual`, 0 at the exact minimiser) shows how far. Below, every plain solve is
# `optimal` and agrees with the oracle to eight digits. Its KKT residual, though, is mostly between
# $10^{-6}$ and $10^{-4}$, where the oracle's, polished by Newton steps, is $10^{-8}$ or smaller.

# %%
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
              f"({res.status}, KKT {res.residual:.0e})")
