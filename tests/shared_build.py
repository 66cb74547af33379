"""Build something expensive once per test run, whichever pytest-xdist worker needs it first.

A session fixture is built once per worker; when tests that share it run in several workers
(xdist spreads them unless they are in one xdist group) each would build it again. This puts
the result in a directory of the run's temp root, which every worker of one run shares
(pytest-xdist's own recipe), under a file lock: the first worker builds it, the others wait
for it and read it. A build that failed leaves no `.built` mark and is redone by the next one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], None], *, wait: bool = True) -> Path | None:
    """`<run temp>/shared-NAME`, made by `build(directory)` unless a worker of this run has
    made it already. With wait=False, None when another worker is building it right now."""
    root = shared_root(tmp_path_factory)
    target = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        try:
            if not (target / ".built").exists():
                shutil.rmtree(target, ignore_errors=True)  # what a failed build left
                target.mkdir()
                build(target)
                (target / ".built").touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def each_built_once(tmp_path_factory: pytest.TempPathFactory, names: list[str],
                    build: Callable[[str, Path], None]) -> dict[str, Path]:
    """built_once for several names: those no other worker is building first, so that two
    workers arriving together build different ones side by side, then wait for the rest."""
    done: dict[str, Path] = {}
    for name in names:
        path = built_once(tmp_path_factory, name, lambda d, n=name: build(n, d), wait=False)
        if path is not None:
            done[name] = path
    for name in names:
        if name not in done:
            done[name] = built_once(tmp_path_factory, name, lambda d, n=name: build(n, d))
    return {name: done[name] for name in names}
