"""Issue 52's pinned iterates: the recipes and their recorder (``record.py``), whose fixtures in
``tests/data/pinned/`` ``tests/test_pinned_iterates.py`` checks."""
