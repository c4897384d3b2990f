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
# # 05 · The fast backend against the oracle
#
# **What it teaches.** The CVXPY oracle solves every block to certified optimality, which makes it
# the reference any faster solver is checked against (in the spirit of the paper's Section 4.5: every
# block is a small convex problem, parallel over data points or units). `fenchel_cvx.fast` solves
# the *same block objects* (`fenchel_cvx.blocks`) with array solvers. We compare the two block by
# block — objective values, minimisers, KKT residuals — for every activation and loss, then compare
# their speed on whole training runs.
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

from fenchel_cvx import LiftedNetwork
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.datasets import load_digits, one_hot
from fenchel_cvx.fast import FastBackend
from fenchel_cvx.oracle import OracleBackend

oracle, fast = OracleBackend(), FastBackend()
rng = np.random.default_rng(0)

# %% [markdown]
# ## Block by block
#
# Five blocks of one network for each activation and loss, solved by both backends from the same
# data. The table and the left plot show that the block values agree to about $10^{-10}$ (relative)
# or better, and the minimisers to a few times $10^{-6}$ or better. In the right plot each point is one block; the
# points below the dashed diagonal took the fast backend less time than the oracle, and nearly all
# of them lie below it.

# %%
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
          f"{r['dz']:9.1e} {r['kkt']:9.1e}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
labels = [f"{r['act'][:5]}/{r['loss'][:3]}/{r['block']}" for r in rows]
axes[0].semilogy([max(r["rel"], 1e-17) for r in rows], "o")
axes[0].set(title="relative difference of block values (fast vs oracle)", xlabel="block #")
axes[1].loglog([r["t_oracle"] for r in rows], [r["t_fast"] for r in rows], "o")
lim = [min(r["t_fast"] for r in rows) / 2, max(r["t_oracle"] for r in rows) * 2]
axes[1].plot(lim, lim, "--", color="gray")
axes[1].set(title="seconds per block", xlabel="oracle", ylabel="fast")
plt.show()

# %% [markdown]
# ## Whole runs
#
# The same network, data and iterations, trained by each backend. On the right, the objectives
# after each iteration lie on top of each other (the printed values agree to four digits). On the
# left, the wall-clock time of each run against the number of data points $m$ (log scale). The
# oracle's time grows about in proportion to $m$. The fast backend is several times faster at
# every size, and its lead grows with $m$. The seconds depend on the machine and on its load, so one timing is noisy.
# The saved outputs come from the larger sizes of `FENCHEL_NOTEBOOK_FULL=1`.

# %%
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
plt.show()
