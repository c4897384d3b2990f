"""fenchel_cvx: Fenchel lifted networks (Gu, Askari, El Ghaoui, AISTATS 2020), convex-optimization first.

Public names only; the docs pages hold the mathematics and the layout.
"""
from .activations import ACTIVATIONS, Activation, activation, monotone
from .backends import BACKENDS
from .bcd import BCDResult, fit_bcd
from .estimator import FenchelClassifier, FenchelRegressor
from .errors import CertificateError, FenchelError, SolverError
from .history import History
from .losses import LOSSES, loss
from .layers import AvgPool2d, Conv2d, Dense, Flatten
from .network import LiftedNetwork, lenet5
from .predict import predict, predict_classes

__version__ = "0.1.0"
__all__ = ["ACTIVATIONS", "Activation", "activation", "monotone", "LOSSES", "loss",
           "LiftedNetwork", "lenet5", "Dense", "Conv2d", "AvgPool2d", "Flatten", "fit_bcd", "BCDResult", "BACKENDS", "History", "predict",
           "predict_classes", "FenchelClassifier", "FenchelRegressor", "FenchelError", "SolverError", "CertificateError"]
