"""The package's default hyperparameters: one set, shared by the network, the driver, the
command line and the estimators.

The lifted objective (eq. (5) of the paper; docs/mathematics.md)

    F(W, X) = L(Y, W_L X~_L) + sum_l rho_l ||W_l||^2 + sum_{l<L} lam_l B_l(X_{l+1}, W_l X~_l)

and, in the batched model (Algorithm 2), the proximal term ``gamma_l ||W_l - W0_l||^2`` of each
W-block. The values were chosen by the MNIST measurements of docs/results.md ("MNIST MLP:
threads, speed and tuning": 784-300-10 ReLU, cross-entropy, batch 500, the fast backend): lam 1,
rho 1e-3, gamma 3 were the best measured setting at 1 W-step and 10 X-steps per batch (rho 1e-2
was ahead by less than one seed's noise). ``benchmarks/mnist_mlp.py`` runs the paper's setting
(lam 0.2, gamma (1, 100), rho 0) tuned on a validation split: gamma (1, 30), 10 W_0-steps
(in the span of the batch, ``fast.span``, which needs rho = 0) and one W_1-step, 20 X-steps,
momentum (0.7, 0); 1.3 points more accurate there, at 2.4 times the FLOPs per batch. Losses and penalties are sums over
the data points (of the batch, in Algorithm 2), so these values are on the scale of a few
hundred points per round.

Consumers: ``LiftedNetwork`` (``LAM``, ``RHO``), ``fit_bcd`` (``gamma=None``: ``GAMMA`` in
Algorithm 2, ``GAMMA_FULL_BATCH`` in Algorithm 1; ``ITERATIONS``, ``ALTERNATIONS``, ``TOL``),
the ``fenchel-cvx`` command (the same, with ``LAM_FULL_BATCH`` / ``RHO_FULL_BATCH`` for a run
without ``--batch-size``, and ``W_STEPS`` / ``X_STEPS`` for a batched run on the
fast backend) and ``FenchelClassifier`` / ``FenchelRegressor`` (``LAM``, ``RHO``, ``GAMMA``,
``ITERATIONS``, ``ALTERNATIONS``). Change a value here and every one of them follows.
"""

#: lambda_l, the weight of the divergence B_l of every hidden layer (> 0)
LAM = 1.0
#: rho_l, the Frobenius penalty of every W_l (>= 0)
RHO = 1e-3
#: lam and rho of the command line's Algorithm 1 (all the data in every round, ``--batch-size``
#: not given): with a full data set in each W-block, lam 1 and rho 1e-3 leave the digits quick
#: start below logistic regression (0.9489 against 0.9689), lam 10 and rho 1 beat it (0.9711)
LAM_FULL_BATCH = 10.0
RHO_FULL_BATCH = 1.0
#: gamma_l of Algorithm 2's proximal term (> 0, as in the paper's batched model: with gamma = 0
#: and a small batch the W-blocks lose strict convexity, and for cross-entropy often their
#: minimiser)
GAMMA = 3.0
#: gamma_l of Algorithm 1 (all the data in every round: no proximal term)
GAMMA_FULL_BATCH = 0.0
#: Algorithm 1's rounds on all the data
ITERATIONS = 10
#: Algorithm 2's rounds per batch (the paper's K)
ALTERNATIONS = 1
#: the certificate's tolerance (and that of a backend built by name): KKT residual of a block
TOL = 1e-6
#: warm-started W-steps and FISTA X-steps per batch of a batched run on the fast backend: the
#: inexact blocks of the MNIST measurements (``FastBackend(w_steps=1, x_steps=10)``); an
#: unbatched run and the oracle solve every block to ``TOL``
W_STEPS = 1
X_STEPS = 10


def for_run(batch_size):
    """``(lam, rho, gamma)`` of a run: the batched set for Algorithm 2 (an integer
    ``batch_size``), the full-batch set for Algorithm 1 (``batch_size=None``)."""
    if batch_size is None:
        return LAM_FULL_BATCH, RHO_FULL_BATCH, GAMMA_FULL_BATCH
    return LAM, RHO, GAMMA


def gamma_for(batch_size):
    """The default gamma of a run: ``GAMMA`` for Algorithm 2 (an integer ``batch_size``),
    ``GAMMA_FULL_BATCH`` for Algorithm 1 (``batch_size=None``)."""
    return GAMMA_FULL_BATCH if batch_size is None else GAMMA
