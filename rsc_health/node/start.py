"""The node path's entry in a fresh interpreter: what the prolog, epilog and sweep scripts run,
`python -c JOB_START_CODE prolog|epilog|sweep`.

Not `python -m rsc_health.nodepath`: -m imports runpy, and with it importlib.util,
contextlib, collections, functools, operator, types and warnings (7.8 ms of a 17.9 ms bare
start alone; less once the node path needs some of them too, benchmarks/bench_prolog.py). The
node zipapp still starts through runpy (a zip's __main__ always does; its sys.path[0] is the
zip). The working directory is taken off sys.path before anything is imported (-m and -c put
it first). Standard library only, Python 3.9 syntax.
"""

from __future__ import annotations

from rsc_health.node import JOB_START_GC_THRESHOLD

# First of all, the working directory leaves sys.path: `-c` puts it ahead of the standard
# library and rsc_health, and slurmd runs prologs in its own (/var/tmp when its log and spool
# directories are not writable), an operator perhaps in /tmp: a json.py or an rsc_health
# package anyone planted there would run as root. `sys` is built in: nothing is looked up
# before the path is clean.
JOB_START_CODE = ("import sys; sys.path[:] = [p for p in sys.path if p]; "
                  "from rsc_health.node.start import job_start; job_start()")


def job_start() -> None:
    """The job-start GC threshold before any import of the node path, then
    nodepath.main_and_leave with sys.argv (which does not return)."""
    import gc

    gc.set_threshold(JOB_START_GC_THRESHOLD)
    from rsc_health.nodepath import main_and_leave

    main_and_leave()
