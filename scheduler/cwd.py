"""The working directory's modules importable (`examples.wordcount`, a `python` node's `function`), as
`python -m` makes them: the CLI and the API's run, submit, stream and compile see the same modules."""

from __future__ import annotations

import os
import sys


def use_cwd_modules() -> None:
    """Put the working directory first on sys.path, as `python -m` does, unless it is there already."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
