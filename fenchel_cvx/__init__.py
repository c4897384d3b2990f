"""fenchel_cvx: Fenchel lifted networks (Gu, Askari, El Ghaoui, AISTATS 2020), convex-optimization first.

Public names only; see DESIGN.md for the mathematics and the layout.
"""
from .activations import ACTIVATIONS, Activation, activation, monotone
from .losses import LOSSES, loss
from .network import LiftedNetwork

__version__ = "0.1.0"
__all__ = ["ACTIVATIONS", "Activation", "activation", "monotone", "LOSSES", "loss",
           "LiftedNetwork"]
