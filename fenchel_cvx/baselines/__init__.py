"""Baselines the lifted networks are compared with: backprop in PyTorch (SGD, Adam) for the
paper's Figures 2-4, and, in ``fenchel_cvx.baselines.lifted``, the lifted methods of its Figure 1
(Taylor et al., Lau et al., Askari et al.) with FLN and SGD behind one entry point, ``fit_lifted``.

``train_backprop`` trains an MLP or a conv net (e.g. LeNet-5) on the same batch schedule
(``datasets.batch_order``) as the lifted-network trainer; ``torch_model`` builds it in
PyTorch; ``BASELINES["sgd"]`` / ``BASELINES["adam"]`` are the two optimizers.
PyTorch is imported only when a baseline runs (``pip install "fenchel_cvx[bench]"``).
"""

from .backprop import BASELINES, BackpropResult, torch_model, train_backprop

__all__ = ["BASELINES", "BackpropResult", "torch_model", "train_backprop"]
