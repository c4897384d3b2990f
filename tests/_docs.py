"""The docs site built as CI builds it: ``mkdocs build --strict`` of ``mkdocs.yml`` into a
folder, the package importable from the repository."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_site(site):
    """``mkdocs build --strict`` into ``site`` (a path; its parent is the working folder).
    -> the ``CompletedProcess``, its output captured as text."""
    env = dict(
        os.environ,
        NO_MKDOCS_2_WARNING="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    command += ["--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)]
    return subprocess.run(
        command, cwd=Path(site).parent, env=env, capture_output=True, text=True, timeout=600
    )
