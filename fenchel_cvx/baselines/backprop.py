"""Backpropagation baselines: an MLP trained by SGD or Adam in PyTorch, the paper's comparison.

The network is the one the lifted model relaxes: ``layer_sizes = (p_0, ..., p_{L+1})``,
Xavier-uniform weights, zero biases, ``activation`` between layers, softmax cross-entropy on
the logits (the *mean* over the batch, as usual for backprop; learning rates are on that scale).
It trains on ``batches = batch_order(...)`` so that it sees exactly the batches, in the same
order, as the lifted-network trainer. Inputs follow the package's orientation (columns are data
points) and are transposed once. Computation is in float32 on the CPU.

``seconds`` counts training time only (forward, backward, optimizer steps); evaluations are
excluded. The final weights come back in the package's convention: ``W_l`` of shape
``(p_{l+1}, p_l + 1)``, the bias as its last column.
"""
import numbers
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

# name -> (torch.optim class name, default learning rate)
OPTIMIZERS = {"sgd": ("SGD", 1e-2), "adam": ("Adam", 1e-3)}
# name -> the batch loss of (outputs, integer labels): the mean over the batch
LOSSES = {
    "cross_entropy": lambda torch, out, y: torch.nn.functional.cross_entropy(out, y),
    # MSE on one-hot targets, summed over the classes (the paper's Figure 1 network)
    "mse": lambda torch, out, y: ((out - torch.nn.functional.one_hot(y, out.shape[1]).to(out.dtype))
                                  ** 2).sum(1).mean(),
}
# name -> torch.nn module class name
ACTIVATIONS = {"relu": "ReLU", "leaky_relu": "LeakyReLU", "sigmoid": "Sigmoid", "tanh": "Tanh"}


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError('the backprop baselines need PyTorch: pip install "fenchel_cvx[bench]"') from None
    return torch


@dataclass
class BackpropResult:
    """Per-epoch curves of one backprop run (index e = after epoch e+1)."""

    optimizer: str
    lr: float
    layer_sizes: tuple
    initial_test_accuracy: float
    initial_train_loss: float
    test_accuracy: list = field(default_factory=list)
    train_accuracy: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)  # mean loss on the whole train set
    seconds: list = field(default_factory=list)  # cumulative training wall-clock time
    checkpoints: list = None  # [(batches seen, seconds, test accuracy)] every eval_every batches
    weights: list = None  # final [W_l] of shape (p_{l+1}, p_l + 1), bias last column


def _check_inputs(layer_sizes, X_train, y_train, X_test, y_test, batches):
    sizes = tuple(layer_sizes)
    if len(sizes) < 2 or any(isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 1
                             for p in sizes):
        raise ValueError(f"layer_sizes must be at least two positive integers, got {layer_sizes!r}")
    for name, X, y in (("X_train", X_train, y_train), ("X_test", X_test, y_test)):
        X, y = np.asarray(X), np.asarray(y)
        if X.ndim != 2 or X.shape[0] != sizes[0]:
            raise ValueError(f"{name} must have shape (layer_sizes[0]={sizes[0]}, m) (columns are data "
                             f"points), got {X.shape}")
        if y.shape != (X.shape[1],) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"y_{name[2:]} must be {X.shape[1]} integer labels, got {y.dtype} {y.shape}")
        if y.size and (y.min() < 0 or y.max() >= sizes[-1]):
            raise ValueError(f"y_{name[2:]} must hold labels in 0..{sizes[-1] - 1} (layer_sizes[-1]), "
                             f"got range {y.min()}..{y.max()}")
    m = np.asarray(X_train).shape[1]
    if not isinstance(batches, (list, tuple)) or not batches or not all(
            isinstance(ep, (list, tuple)) and ep for ep in batches):
        raise ValueError("batches must be a non-empty list of epochs, each a non-empty list of index "
                         f"arrays (the output of batch_order), got {type(batches).__name__}")
    for e, epoch in enumerate(batches):
        for idx in epoch:
            idx = np.asarray(idx)
            if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer) or idx.size == 0 \
                    or idx.min() < 0 or idx.max() >= m:
                raise ValueError(f"batches[{e}] must hold non-empty integer index arrays in 0..{m - 1}")
    return sizes


def train_backprop(layer_sizes, X_train, y_train, X_test, y_test, *, batches, optimizer="adam",
                   lr=None, activation="relu", slope=0.01, seed=0, threads=None, callback=None,
                   eval_every=None, loss="cross_entropy", weights=None):
    """Train an MLP by backprop on the given batch schedule; return a :class:`BackpropResult`.

    ``optimizer``: ``"adam"`` (default lr 1e-3) or ``"sgd"`` (default lr 1e-2).
    ``activation``: relu, leaky_relu (negative ``slope``), sigmoid or tanh.
    ``loss``: ``"cross_entropy"`` (softmax on the logits) or ``"mse"`` (one-hot targets).
    ``weights``: initial ``[W_l]`` of shape ``(p_{l+1}, p_l + 1)``, bias last column (e.g. a
    ``LiftedNetwork``'s, to start where the lifted methods start); default Xavier from ``seed``.
    ``threads``: ``torch.set_num_threads`` for this call (restored afterwards).
    ``callback(epoch, result)`` runs after every epoch (epoch counts from 1).
    ``eval_every``: record a checkpoint (batches seen, training seconds, test accuracy) every
    that many batches (evaluation time excluded), for curves against batches and seconds.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, got {optimizer!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(map(repr, LOSSES))}, got {loss!r}")
    if isinstance(slope, bool) or not isinstance(slope, numbers.Real) or not 0 < slope < 1:
        raise ValueError(f"slope must be in (0, 1), got {slope!r}")
    lr = OPTIMIZERS[optimizer][1] if lr is None else lr
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral)
                                or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if eval_every is not None and (isinstance(eval_every, bool) or not isinstance(
            eval_every, numbers.Integral) or eval_every < 1):
        raise ValueError(f"eval_every must be a positive integer or None, got {eval_every!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    sizes = _check_inputs(layer_sizes, X_train, y_train, X_test, y_test, batches)
    if weights is not None and [tuple(np.shape(W)) for W in weights] != [
            (q, p + 1) for p, q in zip(sizes[:-1], sizes[1:])]:
        raise ValueError(f"weights must be {len(sizes) - 1} arrays of shapes (p_(l+1), p_l + 1) for "
                         f"layer_sizes {sizes}, got {[np.shape(W) for W in weights]}")
    torch = _torch()
    nn = torch.nn

    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        Xtr, Xte = (torch.from_numpy(np.ascontiguousarray(np.asarray(X).T, dtype=np.float32))
                    for X in (X_train, X_test))
        ytr, yte = torch.as_tensor(np.asarray(y_train), dtype=torch.long), torch.as_tensor(
            np.asarray(y_test), dtype=torch.long)

        gen = torch.Generator().manual_seed(int(seed))
        layers = []
        for i, (p_in, p_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            lin = nn.Linear(p_in, p_out)
            with torch.no_grad():
                nn.init.xavier_uniform_(lin.weight, generator=gen)
                nn.init.zeros_(lin.bias)
                if weights is not None:
                    W = torch.as_tensor(np.asarray(weights[i], dtype=np.float32))
                    lin.weight.copy_(W[:, :-1])
                    lin.bias.copy_(W[:, -1])
            layers.append(lin)
            if i < len(sizes) - 2:
                act = getattr(nn, ACTIVATIONS[activation])
                layers.append(act(slope) if activation == "leaky_relu" else act())
        model = nn.Sequential(*layers)
        opt = getattr(torch.optim, OPTIMIZERS[optimizer][0])(model.parameters(), lr=float(lr))
        loss_fn = partial(LOSSES[loss], torch)

        @torch.no_grad()
        def evaluate(X, y):
            logits = model(X)
            return loss_fn(logits, y).item(), (logits.argmax(1) == y).double().mean().item()

        _, acc0 = evaluate(Xte, yte)
        result = BackpropResult(optimizer, float(lr), sizes, acc0, evaluate(Xtr, ytr)[0],
                                checkpoints=[] if eval_every else None)
        elapsed, seen = 0.0, 0
        for epoch, epoch_batches in enumerate(batches, start=1):
            for idx in epoch_batches:
                t0 = time.perf_counter()
                idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
                opt.zero_grad(set_to_none=True)
                loss_fn(model(Xtr[idx]), ytr[idx]).backward()
                opt.step()
                elapsed += time.perf_counter() - t0
                seen += 1
                if eval_every and seen % eval_every == 0:
                    result.checkpoints.append((seen, elapsed, evaluate(Xte, yte)[1]))
            loss, train_acc = evaluate(Xtr, ytr)
            result.train_loss.append(loss)
            result.train_accuracy.append(train_acc)
            result.test_accuracy.append(evaluate(Xte, yte)[1])
            result.seconds.append(elapsed)
            if callback is not None:
                callback(epoch, result)
        linears = [mod for mod in model if isinstance(mod, nn.Linear)]
        result.weights = [np.hstack([lin.weight.detach().double().numpy(),
                                     lin.bias.detach().double().numpy()[:, None]]) for lin in linears]
        return result
    finally:
        torch.set_num_threads(old_threads)


BASELINES = {name: partial(train_backprop, optimizer=name) for name in OPTIMIZERS}
