"""The lifted methods of the paper's Figure 1, on one entry point: ``fit_lifted``.

Non-batched, MSE, ReLU networks (784-300-10 in the paper). Every method starts from the same
Xavier weights (``LiftedNetwork(..., seed=seed)``), trains on the same data and is scored the
same way: the test accuracy of the feed-forward network its weights define, after every
iteration (epoch for SGD). One history format (:class:`LiftedRun`) for all five:

============  =================================================================  ==============
name          method                                                             module
============  =================================================================  ==============
``taylor``    Taylor et al. 2016, ADMM with a multiplier on the output layer     ``taylor``
``lau``       Lau et al. 2018 / Zeng et al. 2019, proximal three-splitting BCD    ``lau``
``askari``    Askari et al. 2018, lifted neural networks (BCD, NNLS X-steps)     ``askari``
``fln``       Fenchel lifted networks, Algorithm 1 (``fit_bcd``, fast backend)   ``fln``
``sgd``       backprop with SGD on the same network and loss                      ``sgd``
============  =================================================================  ==============

See ``docs/lifted.md`` for the equations and where each peer's paper and code disagree.
"""

from .common import METHODS, LiftedMethod, LiftedRun, fit_lifted

__all__ = ["METHODS", "LiftedMethod", "LiftedRun", "fit_lifted"]
from . import askari, fln, lau, sgd, taylor  # noqa: E402,F401  (each registers its method)
