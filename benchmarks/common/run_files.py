"""A run folder's files after a kill: which final-named files do not read whole.

The kill benchmarks (``kill_writes.py``: ``train`` and ``resume`` SIGKILLed; ``rank_faults.py``:
a rank of ``train --nproc 2`` SIGKILLed) check after each kill that every file the run wrote
reads whole, as ``io.atomic_write`` promises (docs page "Installation", "Reliability").
"""

import json

import numpy as np

PNG_START = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def half_written(folder):
    """The final-named files of ``folder`` that do not read whole: JSON that does not parse, an
    .npz whose members do not load, a PNG without its signature or its IEND chunk (one line
    each; an empty list: every one is whole). Temporaries (``.<name>...tmp``) are not final."""
    bad = []
    for path in sorted(folder.iterdir() if folder.is_dir() else ()):
        if path.name.startswith("."):
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
            elif path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    for key in z.files:
                        z[key]
            elif path.suffix == ".png":
                data = path.read_bytes()
                if not (data.startswith(PNG_START) and data.endswith(PNG_END)):
                    raise ValueError(f"{len(data)} bytes, not a whole PNG")
        except Exception as err:  # noqa: BLE001 - every failure is a finding
            bad.append(f"{path.name}: {type(err).__name__}: {err}")
    return bad
