"""The leftover family tells a running job from one that is over by slurmstepd's sockets in
SlurmdSpoolDir (`<node>_<job>.<step>`, src/slurmd/common/stepd_api.c): on a real slurmd
(Debian slurm-wlm 22.05) the running job's steps are there, named as the family reads them,
and gone once the job has ended."""

from __future__ import annotations

import re

from rsc_health.checks import leftover


def _jobs_in(spool) -> set[str]:
    return {m.group(1) for p in spool.iterdir()
            if (m := leftover._STEP_SOCKET.search(p.name))}


def test_a_running_jobs_steps_are_in_the_spool_dir_as_read_and_go_when_it_ends(slurm_cluster):
    c = slurm_cluster
    job = c.sbatch("-w", "node01", "--wrap", "sleep 30")
    spool = c.base / "spool" / "node01"
    c.wait_for(lambda: job in _jobs_in(spool), 30)
    names = sorted(p.name for p in spool.iterdir() if p.name.startswith("node01_"))
    assert any(re.fullmatch(rf"node01_{job}\.\d+", n) for n in names), names
    c.run(["scancel", job])
    c.wait_for(lambda: job not in _jobs_in(spool), 60)
