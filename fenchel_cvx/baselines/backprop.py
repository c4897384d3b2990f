"""Backpropagation baselines, the paper's comparison: the same network trained by SGD or Adam in
PyTorch.

The network is the one the lifted model relaxes. It is given either as ``layer_sizes = (p_0, ...,
p_{L+1})`` (a dense MLP), as a ``LiftedNetwork``'s ``get_config()`` dict (any sequence of layer
specs: dense, conv2d, avgpool2d, flatten; e.g. LeNet-5), or as the ``LiftedNetwork`` itself,
whose initial weights are then copied so that both methods start from the same point.
``activation`` follows every weighted layer but the last, before the pooling that the lifted
model folds into the next map (``X_{l+1} = phi(U_l)``, then ``U_{l+1} = conv(W, pool(X_{l+1}))``).
Without given weights: Xavier-uniform (PyTorch's fans for a convolution), zero biases. The loss
is softmax cross-entropy on the logits (the *mean* over the batch, as usual for backprop;
learning rates are on that scale). It trains on ``batches = batch_order(...)`` so that it sees
exactly the batches, in the same order, as the lifted-network trainer. Inputs follow the
package's orientation (columns are data points, an image's features in (C, H, W) order) and are
transposed once. Computation is in float32, on the CPU or (``device="cuda"``) on a GPU (where
PyTorch's default lets cuDNN's convolutions use TF32).

``seconds`` counts training time only (forward, backward, optimizer steps); evaluations are
excluded. On a GPU the clock is read after ``torch.cuda.synchronize()``, so that it counts the
device's work, not only its launch. The final weights come back in the package's convention:
``W_l`` of shape ``(p_{l+1}, p_l + 1)`` (a convolution: ``(C_out, C_in k k + 1)``), the bias as
its last column.

With ``comm`` (the communicator of P ranks: ``parallel.Ranks.run``, or
``parallel.comm_from_environment`` under torchrun) the model trains under PyTorch's
``DistributedDataParallel`` on the ranks' process group, the data-parallel baseline beside FLN on
ranks: each rank steps on its share of every batch (``reduce.share``, FLN's rule), its mean loss
weighted by its share of the batch times P, so that DDP's average of the ranks' gradients is the
whole batch's mean-loss gradient, and every rank takes the same optimizer step.
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
from tqdm.auto import tqdm

from ..activations import ACTIVATIONS, activation_names
from ..activations import activation as make_activation
from ..arrays import Array, transposed
from ..losses import loss as make_loss
from ..losses import loss_names
from ..reduce import share
from ..validation import (
    BOOL,
    CALLABLE,
    COUNT,
    FRACTION,
    MOMENTUM,
    SEED,
    WEIGHT,
    Options,
    Sizes,
    check,
    check_matrix,
    validate,
)

if TYPE_CHECKING:
    from ..network import LiftedNetwork

#: a network as the baselines take it: layer sizes (an MLP), a ``LiftedNetwork.get_config()``
#: dict, or a ``LiftedNetwork``
Network: TypeAlias = "Sequence[int] | dict[str, Any] | LiftedNetwork"

# name -> (torch.optim class name, default learning rate: the paper's)
OPTIMIZERS = {"sgd": ("SGD", 1e-2), "adam": ("Adam", 1e-3)}
#: the optimizers that take a heavy-ball ``momentum`` (PyTorch's SGD: v <- mu v + g, w <- w - lr v)
WITH_MOMENTUM = ("sgd",)
# where the model and the data live: name -> (what it needs that is missing, or None;
# the wait for its queued work), each of torch
DEVICES = {
    "cpu": (lambda torch: None, lambda torch: lambda: None),
    "cuda": (
        lambda torch: (
            None
            if torch.cuda.is_available()
            else (
                f"a CUDA build of PyTorch and a GPU (torch {torch.__version__}: "
                "torch.cuda.is_available() is False)"
            )
        ),
        lambda torch: torch.cuda.synchronize,
    ),
}
# images per forward pass when evaluating (bounds the memory of a conv net on 60,000 images)
EVAL_CHUNK = 5000


def _activation(name, slope):
    """The registered activation ``name``, with ``slope`` where its class takes one; its class
    gives the PyTorch module (``torch_module``)."""
    import inspect

    takes_slope = "slope" in inspect.signature(ACTIVATIONS[name]).parameters
    return make_activation(name, **({"slope": slope} if takes_slope else {}))


def _batch_loss(torch, L, out, y):
    """The loss ``L``'s batch mean of (outputs, integer labels), on one-hot targets
    (``Loss.torch_loss``)."""
    return L.torch_loss(out, torch.nn.functional.one_hot(y, out.shape[1]).to(out.dtype))


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError(
            'the backprop baselines need PyTorch: pip install "fenchel_cvx[bench]"'
        ) from None
    return torch


# --- layer kinds: the spec dict of layers.py -> a torch module on an input of ``shape`` --------
class _TorchLayer:
    """A layer kind: ``build(nn, d, shape)``, the torch module of the spec dict ``d`` on an
    input of ``shape``; ``weighted``: whether it holds one of the network's ``W_l``."""

    weighted: bool = False

    @staticmethod
    def build(nn: Any, d: dict, shape: tuple) -> Any:
        raise NotImplementedError


class _TorchDense(_TorchLayer):
    weighted = True

    @staticmethod
    def build(nn, d, shape):  # the lifted model's dense map flattens an image input
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), int(d["units"])))


class _TorchConv2d(_TorchLayer):
    weighted = True

    @staticmethod
    def build(nn, d, shape):
        if len(shape) != 3:
            raise ValueError(f"conv2d needs a (channels, height, width) input, got shape {shape}")
        return nn.Conv2d(
            shape[0], int(d["channels"]), int(d["kernel"]), padding=int(d.get("padding", 0))
        )


class _TorchAvgPool2d(_TorchLayer):
    weighted = False

    @staticmethod
    def build(nn, d, shape):
        return nn.AvgPool2d(int(d["size"]))


class _TorchFlatten(_TorchLayer):
    weighted = False

    @staticmethod
    def build(nn, d, shape):
        return nn.Flatten()


TORCH_LAYERS: dict[str, type[_TorchLayer]] = {
    "dense": _TorchDense,
    "conv2d": _TorchConv2d,
    "avgpool2d": _TorchAvgPool2d,
    "flatten": _TorchFlatten,
}


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
    checkpoints: list | None = (
        None  # [(batches seen, seconds, test accuracy)] every eval_every batches
    )
    weights: list | None = None  # final [W_l], bias last column (a conv: (C_out, C_in k k + 1))
    momentum: float = 0.0  # SGD's heavy-ball momentum (0: plain SGD; Adam: 0)


def _architecture(network):
    """``(input_shape, layer dicts, initial weights or None)`` of sizes, a config or a network."""
    init = None
    if hasattr(network, "get_config") and hasattr(network, "W"):
        init = [np.asarray(W) for W in network.W]
        network = network.get_config()
    if isinstance(network, dict):
        if "input_shape" not in network or "layers" not in network:
            raise ValueError(
                "network must be layer sizes, a LiftedNetwork or its get_config() dict "
                f"(with 'input_shape' and 'layers'), got keys {sorted(network)}"
            )
        layers = list(network["layers"])
        for d in layers:
            if not isinstance(d, dict) or d.get("kind") not in TORCH_LAYERS:
                raise ValueError(
                    f"network layer must be a dict with 'kind' one of "
                    f"{sorted(TORCH_LAYERS)}, got {d!r}"
                )
        return tuple(int(n) for n in network["input_shape"]), layers, init
    sizes = check("layer_sizes", tuple(network) if isinstance(network, list) else network, Sizes(2))
    return (sizes[0],), [{"kind": "dense", "units": p} for p in sizes[1:]], init


def _build_model(nn, torch, input_shape, layers, activation, slope):
    """The torch model, its weighted modules, and the flattened feature count after each one."""
    mods, weighted, sizes, shape = [], [], [math.prod(input_shape)], tuple(input_shape)
    n_weighted = sum(TORCH_LAYERS[d["kind"]].weighted for d in layers)
    for d in layers:
        kind = TORCH_LAYERS[d["kind"]]
        mod = kind.build(nn, d, shape)
        try:
            with torch.no_grad():
                shape = tuple(mod(torch.zeros((1, *shape))).shape[1:])
        except RuntimeError as err:
            raise ValueError(
                f"network layer {d!r} does not fit its input of shape {shape}: {err}"
            ) from None
        mods.append(mod)
        if kind.weighted:
            weighted.append(mod[-1] if isinstance(mod, nn.Sequential) else mod)
            sizes.append(math.prod(shape))
            if len(weighted) < n_weighted:
                mods.append(_activation(activation, slope).torch_module())
    if not weighted or not TORCH_LAYERS[layers[-1]["kind"]].weighted:
        raise ValueError(
            f"network must end with a weighted layer (dense or conv2d), got {layers!r}"
        )
    return nn.Sequential(*mods), weighted, tuple(sizes)


def _set_weights(torch, nn, modules, weights, gen):
    """Copy the package's ``[W_l]`` (bias last column) into the modules, else Xavier-uniform."""
    with torch.no_grad():
        for l, mod in enumerate(modules):
            if weights is None:
                nn.init.xavier_uniform_(mod.weight, generator=gen)
                nn.init.zeros_(mod.bias)
                continue
            W = np.asarray(weights[l])
            want = (mod.weight.shape[0], mod.weight[0].numel() + 1)
            if W.shape != want:
                raise ValueError(f"init_weights[{l}] must have shape {want}, got {W.shape}")
            mod.weight.copy_(
                torch.as_tensor(W[:, :-1], dtype=torch.float32).reshape(mod.weight.shape)
            )
            mod.bias.copy_(torch.as_tensor(W[:, -1], dtype=torch.float32))


def _get_weights(modules):
    return [
        np.hstack(
            [
                mod.weight.detach().cpu().double().reshape(mod.weight.shape[0], -1).numpy(),
                mod.bias.detach().cpu().double().numpy()[:, None],
            ]
        )
        for mod in modules
    ]


def _check_inputs(input_shape, n_out, X_train, y_train, X_test, y_test, batches):
    """The data (``validation.check_matrix``), the integer labels and the batch schedule."""
    n_in = math.prod(input_shape)
    what = (
        f"layer_sizes[0]={n_in}"
        if len(input_shape) == 1
        else f"{n_in} = {'x'.join(map(str, input_shape))}, the network's input shape, flattened"
    )
    for name, X, y in (("X_train", X_train, y_train), ("X_test", X_test, y_test)):
        X, y = check_matrix(name, X, rows=n_in, rows_what=what), np.asarray(y)
        if y.shape != (X.shape[1],) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(
                f"y_{name[2:]} must be {X.shape[1]} integer labels, got {y.dtype} {y.shape}"
            )
        if y.size and (y.min() < 0 or y.max() >= n_out):
            raise ValueError(
                f"y_{name[2:]} must hold labels in 0..{n_out - 1} (layer_sizes[-1]), "
                f"got range {y.min()}..{y.max()}"
            )
    m = np.asarray(X_train).shape[1]
    if (
        not isinstance(batches, (list, tuple))
        or not batches
        or not all(isinstance(ep, (list, tuple)) and ep for ep in batches)
    ):
        raise ValueError(
            "batches must be a non-empty list of epochs, each a non-empty list of index "
            f"arrays (the output of batch_order), got {type(batches).__name__}"
        )
    for e, epoch in enumerate(batches):
        for idx in epoch:
            idx = np.asarray(idx)
            if (
                idx.ndim != 1
                or not np.issubdtype(idx.dtype, np.integer)
                or idx.size == 0
                or idx.min() < 0
                or idx.max() >= m
            ):
                raise ValueError(
                    f"batches[{e}] must hold non-empty integer index arrays in 0..{m - 1}"
                )


#: the constraints of ``train_backprop``'s arguments (``validation.py``)
PARAMETERS = dict(
    optimizer=Options(OPTIMIZERS),
    lr=[WEIGHT, None],
    momentum=MOMENTUM,
    activation=Options(activation_names()),
    slope=FRACTION,
    seed=SEED,
    threads=[COUNT, None],
    callback=[CALLABLE, None],
    eval_every=[COUNT, None],
    progress=BOOL,
    loss=Options(loss_names("classification")),
    device=Options(DEVICES),
)


def torch_model(
    network: Network,
    *,
    activation: str = "relu",
    slope: float = 0.01,
    seed: int = 0,
    init_weights: Sequence[Array] | None = None,
) -> tuple[Any, tuple[int, ...], tuple[int, ...]]:
    """``(model, input_shape, layer_sizes)``: the PyTorch ``nn.Sequential`` of ``network`` (layer
    sizes, a config dict or a ``LiftedNetwork``) on inputs ``(n, *input_shape)``, its weights
    ``init_weights`` (default: the ``LiftedNetwork``'s own, else Xavier-uniform from ``seed``);
    ``model.weighted`` lists its dense and conv modules, one per ``W_l``."""
    check("activation", activation, Options(activation_names()))
    input_shape, layers, net_weights = _architecture(network)
    init_weights = net_weights if init_weights is None else init_weights
    torch = _torch()
    nn = torch.nn
    model, weighted, sizes = _build_model(nn, torch, input_shape, layers, activation, slope)
    if init_weights is not None and len(init_weights) != len(weighted):
        raise ValueError(
            f"init_weights must hold {len(weighted)} matrices, got {len(init_weights)}"
        )
    _set_weights(torch, nn, weighted, init_weights, torch.Generator().manual_seed(int(seed)))
    model.weighted = weighted
    return model, input_shape, sizes


def train_backprop(
    network: Network,
    X_train: Array,
    y_train: Array,
    X_test: Array,
    y_test: Array,
    *,
    batches: Sequence[Sequence[Array]],
    optimizer: str = "adam",
    lr: float | None = None,
    momentum: float = 0.0,
    activation: str = "relu",
    slope: float = 0.01,
    seed: int = 0,
    threads: int | None = None,
    callback: Callable[[int, BackpropResult], object] | None = None,
    eval_every: int | None = None,
    eval_at: Sequence[int] = (),
    init_weights: Sequence[Array] | None = None,
    progress: bool = False,
    loss: str = "cross_entropy",
    device: str = "cpu",
    comm: Any = None,
) -> BackpropResult:
    """Train a network by backprop on the given batch schedule; return a :class:`BackpropResult`.

    ``network``: layer sizes (an MLP), a ``LiftedNetwork.get_config()`` dict, or a
    ``LiftedNetwork`` (its architecture, and its current weights as the starting point).
    ``optimizer``: ``"adam"`` (default lr 1e-3) or ``"sgd"`` (default lr 1e-2): the paper's rates.
    ``momentum``: SGD's heavy-ball momentum in [0, 1) (``torch.optim.SGD(momentum=...)``; 0:
    plain SGD, the paper's); Adam takes none (its betas are PyTorch's defaults).
    ``activation``: relu, leaky_relu (negative ``slope``), sigmoid or tanh.
    ``loss``: ``"cross_entropy"`` (softmax on the logits) or ``"mse"`` (one-hot targets).
    ``threads``: ``torch.set_num_threads`` for this call (restored afterwards).
    ``device``: ``"cpu"`` or ``"cuda"`` (a GPU: model, data and steps there).
    ``callback(epoch, result)`` runs after every epoch (epoch counts from 1).
    ``eval_every``: record a checkpoint (batches seen, training seconds, test accuracy) every
    that many batches (evaluation time excluded), for curves against batches and seconds;
    ``eval_at``: more batch counts to checkpoint at (e.g. ``(1, 5, 20, 100)``).
    ``progress``: a tqdm progress bar over the batches.
    ``init_weights``: the starting ``[W_l]`` in the package's convention (default: the
    network's own if a ``LiftedNetwork`` is given, else Xavier-uniform from ``seed``).
    ``comm``: P ranks' communicator (its ``P``, ``rank`` and process ``group``): data-parallel
    training under DDP, each rank on its share of every batch (the module's docstring); every
    rank evaluates and returns the same result. None: this process alone.
    """
    a = validate(
        PARAMETERS,
        dict(
            optimizer=optimizer,
            lr=lr,
            momentum=momentum,
            activation=activation,
            slope=slope,
            seed=seed,
            threads=threads,
            callback=callback,
            eval_every=eval_every,
            progress=progress,
            loss=loss,
            device=device,
        ),
    )
    lr = OPTIMIZERS[optimizer][1] if a["lr"] is None else a["lr"]
    steps, eval_at = _check_steps(optimizer, momentum, eval_at)
    torch = _torch()
    missing = DEVICES[device][0](torch)
    if missing:
        raise ValueError(f"device={device!r} needs {missing}")
    model, input_shape, sizes = torch_model(
        network, activation=activation, slope=slope, seed=seed, init_weights=init_weights
    )
    _check_inputs(input_shape, sizes[-1], X_train, y_train, X_test, y_test, batches)
    P, rank = _ranks(comm, batches)
    dev = torch.device(device)
    model.to(dev)
    trained = (
        model
        if P == 1
        else torch.nn.parallel.DistributedDataParallel(model, process_group=comm.group)
    )
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        Xtr, ytr, Xte, yte = _tensors(torch, dev, input_shape, X_train, y_train, X_test, y_test)
        opt = getattr(torch.optim, OPTIMIZERS[optimizer][0])(
            model.parameters(), lr=float(lr), **steps
        )
        loss_fn = partial(_batch_loss, torch, make_loss(loss))
        evaluate = _evaluator(torch, model, loss_fn)
        _, acc0 = evaluate(Xte, yte)
        result = BackpropResult(
            optimizer,
            float(lr),
            sizes,
            acc0,
            evaluate(Xtr, ytr)[0],
            checkpoints=[] if eval_every or eval_at else None,
            momentum=float(momentum),
        )
        data = (Xtr, ytr, Xte, yte)
        _epochs(
            torch,
            trained,
            opt,
            loss_fn,
            evaluate,
            data,
            batches,
            result,
            dict(
                eval_every=eval_every,
                eval_at=eval_at,
                callback=callback,
                progress=progress,
                sync=DEVICES[device][1](torch),
                share=partial(_share, P, rank),
            ),
        )
        result.weights = _get_weights(model.weighted)
        return result
    finally:
        torch.set_num_threads(old_threads)


def _ranks(comm, batches):
    """``(P, rank)`` of ``comm`` (one process: ``(1, 0)``), checked: every batch holds at
    least P points, so that each rank has a share."""
    if comm is None:
        return 1, 0
    P, rank = getattr(comm, "P", None), getattr(comm, "rank", None)
    if not (isinstance(P, int) and isinstance(rank, int) and hasattr(comm, "group")):
        raise ValueError(
            f"comm must be the ranks' communicator (P, rank, group), got {type(comm).__name__}"
        )
    smallest = min(len(idx) for epoch in batches for idx in epoch)
    if smallest < P:
        raise ValueError(
            f"comm has {P} ranks, more than the {smallest} points of the smallest batch"
        )
    return P, rank


def _share(P, rank, idx):
    """This rank's share of the batch ``idx`` and its loss weight (its part of the batch
    times P: DDP averages the ranks' gradients)."""
    part = idx[share(len(idx), P, rank)]
    return part, len(part) * P / len(idx)


def _check_steps(optimizer, momentum, eval_at):
    """The optimizer's keyword for momentum (SGD's only) and the set of batch counts to
    checkpoint at, each checked."""
    if momentum and optimizer not in WITH_MOMENTUM:
        raise ValueError(
            f"momentum applies to optimizer in {WITH_MOMENTUM}, got momentum={momentum!r} "
            f"with optimizer={optimizer!r}"
        )
    eval_at = set(eval_at)
    if not all(COUNT.accepts(b) for b in eval_at):
        raise ValueError(
            f"eval_at must hold positive batch counts, got {sorted(eval_at, key=str)!r}"
        )
    return (dict(momentum=float(momentum)) if optimizer in WITH_MOMENTUM else {}), eval_at


def _tensors(torch, dev, input_shape, X_train, y_train, X_test, y_test):
    """The data on ``dev``: float32 inputs one point per row, shaped ``input_shape``, and
    integer labels."""
    Xtr, Xte = (
        torch.from_numpy(transposed(X, dtype=np.float32)).reshape(-1, *input_shape).to(dev)
        for X in (X_train, X_test)
    )
    ytr, yte = (
        torch.as_tensor(np.asarray(y), dtype=torch.long, device=dev) for y in (y_train, y_test)
    )
    return Xtr, ytr, Xte, yte


def _evaluator(torch, model, loss_fn):
    """``evaluate(X, y) -> (mean loss, accuracy)``, in chunks of ``EVAL_CHUNK`` images."""

    @torch.no_grad()
    def evaluate(X, y):
        total = hits = 0.0
        for i in range(0, X.shape[0], EVAL_CHUNK):
            logits = model(X[i : i + EVAL_CHUNK])
            total += loss_fn(logits, y[i : i + EVAL_CHUNK]).item() * logits.shape[0]
            hits += (logits.argmax(1) == y[i : i + EVAL_CHUNK]).sum().item()
        return total / X.shape[0], hits / X.shape[0]

    return evaluate


def _epochs(torch, model, opt, loss_fn, evaluate, data, batches, result, options):
    """The training loop: one optimizer step per batch, the curves after every epoch and the
    checkpoints of ``options`` (eval_every, eval_at, callback, progress, ``sync``, which waits
    for the device, and ``share``: a batch's part on this rank and its loss weight) in
    ``result``. The clock runs over each stretch of steps between two evaluations and stops
    after ``sync()``: a GPU queues the steps of a stretch without a wait."""
    (Xtr, ytr, Xte, yte), o = data, options
    elapsed, seen = 0.0, 0
    # (no bar object without progress: tqdm takes a process lock, left behind by a rank's exit)
    bar = tqdm(total=sum(map(len, batches)), desc=result.optimizer) if o["progress"] else None

    def stretch_ends(t0):  # the seconds since t0, once the device has done the stretch's work
        o["sync"]()
        return time.perf_counter() - t0

    for epoch, epoch_batches in enumerate(batches, start=1):
        t0, running = time.perf_counter(), False
        for idx in epoch_batches:
            idx, weight = o["share"](np.asarray(idx))
            idx = torch.as_tensor(idx, dtype=torch.long, device=Xtr.device)
            opt.zero_grad(set_to_none=True)
            batch_loss = loss_fn(model(Xtr[idx]), ytr[idx])
            (batch_loss if weight == 1 else batch_loss * weight).backward()
            opt.step()
            seen, running = seen + 1, True
            if bar is not None:
                bar.update()
            if (o["eval_every"] and seen % o["eval_every"] == 0) or seen in o["eval_at"]:
                elapsed += stretch_ends(t0)
                result.checkpoints.append((seen, elapsed, evaluate(Xte, yte)[1]))
                t0, running = time.perf_counter(), False
        if running:  # the steps since the last checkpoint
            elapsed += stretch_ends(t0)
        loss, train_acc = evaluate(Xtr, ytr)
        result.train_loss.append(loss)
        result.train_accuracy.append(train_acc)
        result.test_accuracy.append(evaluate(Xte, yte)[1])
        result.seconds.append(elapsed)
        if bar is not None:
            bar.set_postfix(test_acc=result.test_accuracy[-1])
        if o["callback"] is not None:
            o["callback"](epoch, result)
    if bar is not None:
        bar.close()


BASELINES = {name: partial(train_backprop, optimizer=name) for name in OPTIMIZERS}
