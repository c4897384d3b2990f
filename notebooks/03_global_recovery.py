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
# # 03 · One-layer global recovery (Appendix B)
#
# **What it teaches.** For a single layer, the lifted problem is *convex* in the weights, and its
# minimisers are exactly the weights that reproduce the data. Given $Y = \phi(W^\star \tilde X)$ from a
# one-layer network,
#
# $$\min_W \; \sum_{ij} B_\phi\big(Y_{ij}, (W \tilde X)_{ij}\big)$$
#
# is a convex problem (it is the hidden $W$-block with $\lambda = 1$, $\rho = \gamma = 0$) whose minimum
# 0 is attained exactly when $\phi(W \tilde X) = Y$ (Theorem 1); for generic data that is $W^\star$
# alone. The usual non-convex least squares $\min_W \|Y - \phi(W \tilde X)\|^2$, solved by a gradient
# method from random starts, can get stuck (a ReLU unit that is inactive on the data gets no
# gradient). This follows **Appendix B** of the paper; the experiment is `fenchel_cvx.theory.one_layer_recovery`.
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

from fenchel_cvx.theory import one_layer_recovery

restarts = 10 if SMALL else 40
names = ["relu", "leaky_relu", "sigmoid", "tanh"]
# n = 4 inputs, p = 8 units, m = 40 generic data points
results = [one_layer_recovery(a, n=4, p=8, m=40, restarts=restarts, seed=0) for a in names]
print(f"{'activation':11s} {'convex error':>13s} {'status':>8s} {'non-convex: median error':>25s} {'failed starts':>14s}")
for r in results:
    print(f"{r.activation:11s} {r.convex_error:13.1e} {r.convex_status:>8s} "
          f"{np.median(r.nonconvex_errors):25.1e} {r.nonconvex_failures:>7d} / {len(r.nonconvex_errors)}")

# %% [markdown]
# The convex problem recovers $W^\star$ to solver precision for every activation. Each dot on the right
# is one random start of L-BFGS on the non-convex least squares; those above the dashed line
# (relative error $> 10^{-3}$) failed.

# %%
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
ax.set_ylabel(r"relative error $\|W - W^\star\| / \|W^\star\|$")
ax.set_title("one-layer recovery (n = 4, p = 8, m = 40)")
ax.legend(loc="upper right", fontsize="small")
plt.show()

# %% [markdown]
# ## How many data points?
#
# With $m$ points the convex problem has $p(n+1)$ unknowns. For tanh (strictly increasing) every
# data point determines $W^\star \tilde x_j$, so $m \ge n + 1$ generic points suffice. For ReLU a
# unit says nothing about $W^\star$ on the points where it is inactive ($Y_{ij} = 0$ only tells
# $(W \tilde X)_{ij} \le 0$), so each unit must be *active* on at least $n + 1$ generic points
# for $W^\star$ to be the only zero of the objective. Otherwise the minimiser is not unique and the
# error stays large. The table counts, for each $m$, the points on which each unit of $W^\star$ is
# active. $W^\star$ and the data are drawn anew for each $m$ (seed 1). So a unit that happens to
# be active on too few points makes the ReLU error jump, however large $m$ is: at $m = 40$ one
# unit of the draw is active on **no** point at all. That is a dead unit: any weight row that is
# nonpositive on all the data fits it exactly, and the solver returns one of them. Such $m$ are
# drawn hollow in the plot.

# %%
ms = [3, 5, 8, 12, 20, 40] if SMALL else [3, 4, 5, 6, 8, 10, 12, 16, 20, 30, 40, 80]
runs = {a: [one_layer_recovery(a, n=4, p=3, m=m, restarts=1, seed=1) for m in ms]
        for a in ("relu", "tanh")}
print(f"{'m':>3s} {'ReLU: active points per unit':>29s} {'ReLU error':>11s} {'tanh error':>11s}")
for r, t in zip(runs["relu"], runs["tanh"]):
    print(f"{r.m:3d} {str(r.active_points):>29s} {r.convex_error:11.1e} {t.convex_error:11.1e}")

fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
for a, rs in runs.items():
    e = np.maximum([r.convex_error for r in rs], 1e-16)
    line, = ax.semilogy(ms, e, "-o", label=a)
    if a == "relu":   # hollow: some unit of W* is active on fewer than n + 1 points
        few = [i for i, r in enumerate(rs) if min(r.active_points) < 4 + 1]
        ax.plot(np.take(ms, few), e[few], "o", mfc="white", color=line.get_color(),
                label="relu, a unit active on < n + 1 points")
ax.axvline(4 + 1, ls=":", color="gray", label="n + 1")
ax.set(xlabel="number of data points m", ylabel="relative error (convex)", title="recovery vs m (n = 4, p = 3)")
ax.legend(fontsize="small")
plt.show()
