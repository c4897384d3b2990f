"""The benchmarks' shared harness: what every script in ``benchmarks/`` takes from one place.

- ``data``: MNIST (or CIFAR-10) from ``--data-dir`` or ``$FENCHEL_DATA``, the embedded 5k MNIST
  for ``--quick``, and the one validation rule: ``--validation N`` holds out the *last* N
  training images (``Dataset.for_tuning``), never the test set;
- ``flags``: the flags the training benchmarks share, and their checks (each error names the
  flag and the value, before any work);
- ``devices``: where the methods run (``--device``), the machine's record, the BLAS and GEMM
  rates;
- ``runner``: each method in its own spawned process (its peak memory its own), the backprop
  baselines;
- ``fln``: FLN's timed training loop (Algorithm 2 through ``fit_bcd``), its certificate
  summary and host reads;
- ``reports``: the figures over seeds, the markdown tables, the JSON and the plots;
- ``children``: a file read in a forked child under memory and CPU limits, its outcome, seconds
  and peak memory (the fuzzing pass and the hostile-file battery).
- ``counting``, ``latency``: the collectives a P-rank solve takes, counted in one process, and
  a collective's latency on P ranks of this machine (the cost model of ``parallel_model.py``).

A script runs as ``python benchmarks/<name>.py``; Python puts ``benchmarks/`` on the path, and
the modules import as ``common.<module>``. The scripts' docs page is docs/results.md.
"""

import sys
from pathlib import Path

#: the repository's root: the scripts import the package from the checkout they sit in
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
