"""MkDocs hook: publish the notebooks of ``notebooks/`` under ``notebooks/`` in the site.

Each notebook is a jupytext source ``notebooks/NN_name.py`` paired with ``NN_name.ipynb``, which
holds the cells *with their saved outputs* (``notebooks/README.md``). This hook adds every
``notebooks/*.ipynb`` to the documentation's files before ``mkdocs-jupyter`` renders them (it
runs first: priority 100), so they need not be copied into ``docs/``. mkdocs-jupyter shows them
as saved, with their outputs, and does not execute them: the tests execute the sources.
"""
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File


@event_priority(100)
def on_files(files, config):
    repo = Path(config.config_file_path).resolve().parent
    for path in sorted((repo / "notebooks").glob("*.ipynb")):
        # a File whose source directory is the repository root: src_uri "notebooks/NAME.ipynb"
        files.append(File(f"notebooks/{path.name}", src_dir=str(repo), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files
