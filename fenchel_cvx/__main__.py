"""``python -m fenchel_cvx``: the ``fenchel-cvx`` command (``cli/``)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
