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
# # 07 · Conv blocks as CVXPY problems
#
# **What it teaches.** The paper's convolutional model (Sec. 4.2, "Convolutional model", eqs. (10)-(11)): a
# convolution and an average pooling are linear maps, so the Conv → Activation constraint
# $B_l(X_{l+1}, W_l \ast X_l) \le 0$ and the Pool → Conv → Activation constraint
# $B_l(X_{l+1}, W_l \ast \mathrm{Pool}(X_l)) \le 0$ keep every block of the BCD convex. On one
# tiny conv network and a few 8×8 digits we build
#
# - a **conv X-block**: $\min_Z \lambda_0 B_0(Z, W_0 \ast X_0) + \lambda_1 B_1(X_2, W_1\,\mathrm{Pool}(Z))$,
#   where the pooling and the next layer are one explicit (Toeplitz) matrix;
# - a **conv W-block**: $\min_W \lambda_0 B_0(X_1, W P(X_0)) + \rho_0\|W\|^2$, where $P(X_0)$ are
#   the im2col patches: the filters are the rows of $W$, and the block separates by output channel;
#
# print them, solve them with CVXPY and check them against the oracle; then run one BCD round
# (Algorithm 1) and show the filters and feature maps before and after it. The derivation is on
# the docs page *Convolutional layers*.
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
from fenchel_cvx.bcd import fit_bcd
from fenchel_cvx.blocks import w_block, x_block
from fenchel_cvx.datasets import load_digits, one_hot
from fenchel_cvx.layers import AvgPool2d, Conv2d, Dense, Flatten
from fenchel_cvx.oracle import OracleBackend, block_problem

m = 8 if SMALL else 30
digits = load_digits()
X0, labels = digits.X_train[:, :m], digits.y_train[:m]
Y = one_hot(labels, 10)
net = LiftedNetwork.from_layers(digits.image_shape, [Conv2d(2, 3, padding=1), AvgPool2d(2),
                                                     Flatten(), Dense(10)],
                                activation="relu", loss="cross_entropy", lam=1.0, rho=1e-3, seed=0)
oracle = OracleBackend()
net

# %% [markdown]
# Two maps: $W_0$ is a conv with 2 filters of 3×3 on the 1×8×8 digit (padding 1), giving
# $X_1$ with $2 \cdot 8 \cdot 8 = 128$ features per digit; $W_1$ averages each 2×2 window of
# $X_1$ and applies a dense layer to the $2 \cdot 4 \cdot 4 = 32$ pooled features. The lifted
# variable starts at the feed-forward point.

# %%
Xs = net.forward(X0)[0]
print("X_0:", X0.shape, " X_1:", Xs[0].shape, " W_0:", net.W[0].shape, " W_1:", net.W[1].shape)
A, b = net.layers[1].matrix(net.W[1])
print("the map of W_1 (pool + dense) as one matrix:", A.shape, "- nonzeros per row:",
      int(np.count_nonzero(A[0])))
P = net.layers[0].patches(X0)
print("im2col patches of X_0:", P.shape, "= (1*3*3 + 1 bias row) x (m * 8 * 8 positions)")

# %% [markdown]
# ## The conv X-block
#
# The block of $X_1$ separates by digit; CVXPY sees the conv's output $U_0 = W_0 \ast X_0$ as data
# and the pool + dense map of the next layer as the explicit matrix above. (Clarabel may warn
# that its point is inaccurate on the exponential cone of the log-sum-exp; the oracle polishes
# its own point with Newton steps, so the two values agree to about 1e-6 relative.)

# %%
xb = x_block(net, X0, Y, Xs, 1)
problem, Z = block_problem(xb)
print(f"variable {Z.shape}, DCP: {problem.is_dcp()}")
print(str(problem)[:600], "...")
t = time.perf_counter()
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Solution may be inaccurate")
    problem.solve(solver=cp.CLARABEL)
res = oracle.solve(xb)
X1_new = res.argmin
print(f"CVXPY value {problem.value:.8f}, oracle value {res.value:.8f}, "
      f"max |dZ| {np.abs(Z.value - res.argmin).max():.1e} ({time.perf_counter() - t:.1f} s)")
assert abs(problem.value - res.value) <= 1e-6 * (1 + abs(problem.value))

# %% [markdown]
# ## The conv W-block
#
# The block of $W_0$ is a dense W-block on the patches: each of the 2 filters (a row of $W_0$,
# 9 weights and a bias) sees all $m \cdot 64$ patches. Its Gram matrix $P P^\top$ is 10×10.
# We build it at the updated $X_1$ (the X-block's argmin), where $W_0$ has something to fit.

# %%
wb = w_block(net, X0, Y, [X1_new], 0)
problem, W = block_problem(wb)
print(f"variable {W.shape}, DCP: {problem.is_dcp()}, Gram matrix {(P @ P.T).shape}")
print(str(problem)[:600], "...")
problem.solve(solver=cp.CLARABEL)
res = oracle.solve(wb)
print(f"CVXPY value {problem.value:.8f}, oracle value {res.value:.8f}, "
      f"max |dW| {np.abs(W.value - res.argmin).max():.1e}")
assert abs(problem.value - res.value) <= 1e-6 * (1 + abs(problem.value))

# %% [markdown]
# ## One BCD round: filters and feature maps before and after
#
# Algorithm 1 with the oracle: the X-blocks ($X_1$ here), then the W-blocks ($W_1$, $W_0$), every
# block solved exactly, with the certificate checked after the round.

# %%
W_before = [W.copy() for W in net.W]
maps_before = net.forward(X0)[0][0]
result = fit_bcd(net, X0, Y, iterations=1, backend="cvxpy")
rec = result.history[-1]
print(f"after the X-sweep: lifted objective F = {rec['lifted_x']:.4f} <= network objective "
      f"J = {rec['network_x']:.4f}; certificate violations: {len(rec['certificate']['violations'])}")
maps_after = net.forward(X0)[0][0]
print("largest change of a filter weight:", np.abs(net.W[0] - W_before[0]).max())

fig, axes = plt.subplots(2, 5, figsize=(11, 4.6), layout="constrained")
for row, (W, maps, when) in enumerate(((W_before[0], maps_before, "before"),
                                       (net.W[0], maps_after, "after"))):
    filt = W[:, :-1].reshape(2, 3, 3)
    axes[row, 0].imshow(X0[:, 0].reshape(8, 8), cmap="gray_r")
    axes[row, 0].set_title(f"digit {labels[0]}")
    for c in range(2):
        axes[row, 1 + c].imshow(filt[c], cmap="RdBu_r", vmin=-1, vmax=1)
        axes[row, 1 + c].set_title(f"filter {c} {when}")
        axes[row, 3 + c].imshow(maps[:, 0].reshape(2, 8, 8)[c], cmap="viridis")
        axes[row, 3 + c].set_title(f"map {c} {when}")
for ax in axes.flat:
    ax.set_xticks([]); ax.set_yticks([])
plt.show()

# %% [markdown]
# One exact round moves the filters (top: Xavier-initialised, bottom: after the W_0-block) and
# with them the ReLU feature maps $X_1 = \max(0, W_0 \ast X_0)$ of the digit. The certificate of
# the round holds: $F \le J$ after the X-sweep and no block raised $F$.
