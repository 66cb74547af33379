"""benchmarks/validate.py (the script that prints docs/validation.md's tables), loaded from its
path so that the tests and the published figures cannot drift apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "validate.py"


def _load():
    name = "rsc_health_benchmarks_validate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


validate = _load()
