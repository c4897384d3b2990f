"""The stratified train/test split of the embedded data sets (``load_digits``,
``load_mnist5k``), drawn from a seed, in NumPy alone.

It is the split scikit-learn's ``train_test_split(X, y, test_size=..., random_state=seed,
stratify=y)`` draws (``StratifiedShuffleSplit``), draw for draw from the same
``np.random.RandomState(seed)``, and is tested equal to it (``tests/test_datasets.py``): the
embedded sets keep the split every earlier run of the package trained on, and a process that
loads them no longer imports scikit-learn (about 2 s: its ``scipy.stats`` and ``pandas``).

For ``m`` points and a fraction ``test_size``, ``ceil(test_size * m)`` points are tested and
the rest trained on. Each class's share of the training points is the likeliest count of a
draw without replacement (the multivariate hypergeometric's approximate mode, :func:`_shares`),
and its share of the test points the same of what the class has left; each class's points are
shuffled and cut into the two shares, and each side is shuffled whole. No equation of the
paper is implemented here.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["stratified_split"]


def _shares(counts: np.ndarray, n: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of ``n`` draws each class of ``counts`` members gets: its proportional share
    rounded down, then one more each to the classes with the largest remainders until the
    shares sum to ``n``, ties among equal remainders drawn from ``rng``.

    >>> _shares(np.array([4, 2]), 3, np.random.RandomState(0)).tolist()
    [2, 1]
    >>> _shares(np.array([2, 2, 2, 1]), 2, np.random.RandomState(0)).tolist()
    [0, 1, 1, 0]
    """
    exact = counts / counts.sum() * n
    shares = np.floor(exact)
    missing = int(n - shares.sum())
    remainder = exact - shares
    for value in np.unique(remainder)[::-1]:  # the largest remainders first
        if missing == 0:
            break
        (tied,) = np.nonzero(remainder == value)
        take = min(len(tied), missing)
        shares[rng.choice(tied, size=take, replace=False)] += 1
        missing -= take
    return shares.astype(np.int64)


def stratified_split(y: np.ndarray, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)``: the indices of ``y``'s training and test points, each class in both
    in proportion to its size (module doc); ``test_size`` a fraction in (0, 1).

    >>> y = np.repeat([0, 1, 2], [6, 3, 3])
    >>> train, test = stratified_split(y, 0.25, seed=0)
    >>> len(train), len(test), sorted(np.bincount(y[test]).tolist())
    (9, 3, [1, 1, 1])
    >>> sorted(np.concatenate([train, test]).tolist()) == list(range(12))
    True

    Each side must hold a point of every class:

    >>> stratified_split(y, 0.1, seed=0)
    Traceback (most recent call last):
    ...
    ValueError: test_size must leave each of the 3 classes a test point: 0.1 of 12 points is 2
    """
    y = np.asarray(y)
    m = len(y)
    n_test = math.ceil(test_size * m)
    n_train = m - n_test
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    k = len(counts)
    if counts.min() < 2:
        raise ValueError(f"y must hold at least 2 points of each class, found {counts.min()}")
    for side, n in (("test", n_test), ("training", n_train)):
        if n < k:
            raise ValueError(
                f"test_size must leave each of the {k} classes a {side} point: "
                f"{test_size} of {m} points is {n}"
            )
    members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    train_shares = _shares(counts, n_train, rng)
    test_shares = _shares(counts - train_shares, n_test, rng)
    train, test = [], []
    for points, n_tr, n_te in zip(members, train_shares, test_shares):
        shuffled = points[rng.permutation(len(points))]
        train.append(shuffled[:n_tr])
        test.append(shuffled[n_tr : n_tr + n_te])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))
