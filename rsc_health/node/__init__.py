"""The node path's parts (rsc_health.nodepath is the pipeline and the entry points):

    stage   what differs per entry point (Stage), one run's context and how far it got
    store   the node's local state: the lock, the state dir, pending verdicts, guard backoff
    sinks   where a run says what it saw: stderr/syslog, the spool, the textfile, stdout
    exits   the ways a run ends early: a checker fault, a broken config, the watchdog
    act     carrying a verdict out in Slurm, and the job records

Standard library only, Python 3.9 syntax: every job start imports these.
"""


# The garbage collector's first threshold in a job start's interpreter (node.start.job_start,
# `python -m rsc_health.nodepath`, the node zipapp): CPython's 700 made its imports alone pass the
# collector over every object several times. 20000 live allocations between passes still
# bounds what cyclic garbage a run can hold.
JOB_START_GC_THRESHOLD = 20000

