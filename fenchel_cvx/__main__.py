"""``python -m fenchel_cvx``: the ``fenchel-cvx`` command (``cli.py``)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
