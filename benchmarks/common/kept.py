"""Runs kept on disk as they finish, so that a long benchmark goes on where it stopped.

Each finished run is written to ``folder/<name>-<hash of its key>.json`` with its key, the text
of every setting that makes two runs the same run. With ``resume``, a task whose kept file has
the same key is read instead of run; a file that is unreadable or of other settings is named
and its run goes again.
"""

import hashlib
import json

from common.runner import run_methods
from fenchel_cvx.history import _plain
from fenchel_cvx.io import write_text


def kept_path(folder, name, key):
    """The file of the run ``name`` whose settings are ``key``."""
    return folder / f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"


def read_kept(path, key):
    """A kept run's result; None where the file is absent, unreadable or of other settings."""
    try:
        kept = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        print(f"--resume: {path} is not read ({err}); the run goes again")
        return None
    ok = isinstance(kept, dict) and kept.get("key") == key and isinstance(kept.get("result"), dict)
    if not (ok and isinstance(kept["result"].get("test_accuracy"), list)):
        print(f"--resume: {path} is not a run of these settings; the run goes again")
        return None
    return kept["result"]


def kept_runs(tasks, keys, names, folder, jobs=1, resume=False, kept_only=False, **hooks):
    """``run_methods(tasks, jobs, **hooks)``, each result written to ``folder`` as it finishes
    (``keys[i]``, ``names[i]``: task i's settings and name); with ``resume``, a task whose kept
    file has the same key is read, not run; with ``kept_only`` nothing runs, and a task not
    kept yet is reported as not run."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [kept_path(folder, n, k) for n, k in zip(names, keys)]
    results = [read_kept(p, k) if resume else None for p, k in zip(paths, keys)]
    todo = [i for i, r in enumerate(results) if r is None]
    if resume and tasks:
        print(f"--resume: {len(tasks) - len(todo)} of {len(tasks)} runs read from {folder}")

    def keep(j, result):
        i = todo[j]
        write_text(paths[i], json.dumps(dict(key=keys[i], result=_plain(result))))

    if kept_only:
        fresh = [dict(not_run="not kept yet", test_accuracy=[], seconds=[]) for _ in todo]
    else:
        fresh = run_methods([tasks[i] for i in todo], jobs, on_result=keep, **hooks)
    for i, r in zip(todo, fresh):
        results[i] = r
    return results
