"""The scripts of benchmarks/ loaded as modules, for the tests of what they compute: they are
files, not a package."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load(relative: str, name: str | None = None):
    """benchmarks/`relative` as a module named `name` (its file's stem by default), registered
    in sys.modules while it loads: dataclasses look their module up."""
    path = BENCHMARKS / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
