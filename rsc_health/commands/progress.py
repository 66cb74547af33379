"""Progress for commands that can take more than a few seconds: a transient rich spinner on
stderr naming what is in flight, with the elapsed time, only when the operator watches (stdout
and stderr both a terminal). Under a timer, a pipe or `--json | jq`, nothing is drawn."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def watched() -> bool:
    return (sys.stdout.isatty() and sys.stderr.isatty()
            and not os.environ.get("RSC_HEALTH_NO_PROGRESS"))


def start_spinner(label: str) -> Callable[[], None]:
    """Start a spinner; returns the function that stops it. Output printed meanwhile goes
    above the spinner (rich redirects stdout while it draws: both are the same terminal)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    progress.add_task(label, total=None)
    progress.start()
    return progress.stop


@contextmanager
def steps(enabled: bool, *, log_done: bool = True) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr naming the step in flight; yields the function that names the next
    one (a no-op when disabled). With log_done, each finished step stays as a 'done:' line."""
    if not enabled:
        yield lambda _label: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("starting", total=None)
        current: list[str] = []

        def step(label: str) -> None:
            if log_done and current:
                console.log(f"done: {current[-1]}")
            current[:] = [label]
            progress.update(task, description=label)

        yield step
        if log_done and current:
            console.log(f"done: {current[-1]}")
