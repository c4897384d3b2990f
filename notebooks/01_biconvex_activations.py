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
# # 01 · Biconvex activations (Theorem 1)
#
# **What it teaches.** A layer's constraint $v = \phi(u)$ is not convex, but it is the zero set of
# a nonnegative *biconvex* function. For a continuous increasing activation $\phi$, with
# $F(v) = \int \phi^{-1}$ and its convex conjugate $F^*(u) = \int \phi$,
#
# $$B_\phi(v, u) = F(v) + F^*(u) - u v \;\ge\; 0, \qquad B_\phi(v,u) = 0 \iff v = \phi(u)$$
#
# (the Fenchel–Young inequality). $B_\phi$ is convex in $v$ for fixed $u$ and convex in $u$ for fixed
# $v$. This is **Theorem 1** of the paper (Section 4.1); Fenchel lifted networks replace each layer's
# equality by the penalty $\lambda_l B_l(X_{l+1}, W_l \tilde X_l)$.
#
# We draw $B_\phi$ over the $(u, v)$ plane for ReLU, leaky ReLU, sigmoid and tanh, check that it is
# nonnegative and zero exactly on the graph of $\phi$, look at its convex slices, and build $B_\phi$
# for an activation with no closed form by quadrature (`fenchel_cvx.monotone`).
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

from fenchel_cvx import activation, monotone

# %% [markdown]
# ## $B_\phi$ over the plane
#
# Each heatmap shows $\log_{10}(B_\phi(v, u) + 10^{-3})$ (its colour bar is on its right); the
# white curve is the graph $v = \phi(u)$, where $B_\phi$ vanishes: the darkest band follows it.
# Each panel's $v$ axis spans the range of $\phi$ (ReLU: $v \ge 0$; sigmoid: $[0, 1]$; tanh:
# $[-1, 1]$; leaky ReLU: all of $\mathbb{R}$); outside that range the divergence is $+\infty$.

# %%
ACTS = {"relu": activation("relu"), "leaky_relu (a = 0.2)": activation("leaky_relu", slope=0.2),
        "sigmoid": activation("sigmoid"), "tanh": activation("tanh")}
n_grid = 121 if SMALL else 401
u = np.linspace(-3, 3, n_grid)

fig, axes = plt.subplots(1, 4, figsize=(18, 4), layout="constrained")
fig.get_layout_engine().set(wspace=0.06)   # room between a colour bar and the next panel
for ax, (name, act) in zip(axes, ACTS.items()):
    lo, hi = act.v_range
    v = np.linspace(max(lo, -3.0), min(hi, 3.0), n_grid)
    V, U = np.meshgrid(v, u, indexing="ij")
    B = act.divergence(V, U)
    im = ax.pcolormesh(u, v, np.log10(B + 1e-3), shading="auto", cmap="viridis")
    ax.plot(u, act.phi(u), color="white", lw=2, label=r"$v = \phi(u)$")
    ax.set(title=name, xlabel="u (pre-activation)")
    ax.legend(loc="upper left", fontsize="small")
    fig.colorbar(im, ax=ax)
axes[0].set_ylabel("v (output)")
fig.suptitle(r"$\log_{10}(B_\phi(v, u) + 10^{-3})$")
plt.show()

# %% [markdown]
# ## Zero exactly on the graph
#
# On the graph, $B_\phi(\phi(u), u)$ is zero to rounding; everywhere on the grid it is nonnegative,
# and a step away from the graph it is strictly positive.

# %%
print(f"{'activation':22s} {'max |B| on graph':>17s} {'min B on grid':>14s} {'min B off graph (|v - phi(u)| > 0.1)':>37s}")
for name, act in ACTS.items():
    lo, hi = act.v_range
    v = np.linspace(max(lo, -3.0), min(hi, 3.0), n_grid)
    V, U = np.meshgrid(v, u, indexing="ij")
    B = act.divergence(V, U)
    on_graph = np.abs(act.divergence(act.phi(u), u)).max()
    off_graph = B[np.abs(V - act.phi(U)) > 0.1].min()
    print(f"{name:22s} {on_graph:17.2e} {B.min():14.2e} {off_graph:37.2e}")
    assert on_graph < 1e-12 and B.min() >= -1e-12 and off_graph > 0

# %% [markdown]
# ## Biconvex, not jointly convex
#
# Slices at fixed $u$ are convex in $v$, slices at fixed $v$ are convex in $u$ (left and middle, for
# ReLU: $B(v,u) = \tfrac12 v^2 + \tfrac12 u_+^2 - uv$). Along a diagonal line through the plane the
# function need not be convex (right): the constraint set $\{B \le 0\}$ is the graph, which is not
# convex — the lifted problem is convex *block by block*, which is all block coordinate descent needs.

# %%
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
print("min 2nd difference on the diagonal:", d2(relu.divergence(1 + t, -1 + 3 * t)).min())

# %% [markdown]
# ## Any increasing activation: $F$ and $F^*$ by quadrature
#
# Theorem 1 needs no closed form. `monotone(phi)` computes $F^*(u) = \int_0^u \phi$ by quadrature
# and $B$ as the Bregman divergence of $F^*$ (NumPy only, for checks). For $\phi = \tanh$ it agrees
# with the closed form; for $\phi(u) = u + \tfrac12 \sin u$ (increasing, no closed-form $\phi^{-1}$)
# it is again zero on the graph and positive elsewhere.

# %%
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
ax.set(title=r"$\phi(u) = u + \sin(u)/2$ (by quadrature)", xlabel="u", ylabel="v")
fig.colorbar(im, ax=ax)
plt.show()
