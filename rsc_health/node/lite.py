"""The lite tier of qualification in the prolog of big jobs (issue 24): a job of [qualify]
prolog_lite_min_nodes nodes or more runs, in each node's prolog, the node-local part of the
lite tier -- its dcgm_diag tests (`dcgmi diag -r N`: DCGM's own verdict; a test judged against
peers needs the historian and stays out) -- through the dcgm family, bounded by
prolog_lite_timeout_s and the prolog's budget. The job size comes from the prolog's environment:
no Slurm RPC. Imported only when the key is set: with it 0 (the default) a prolog costs one
config lookup more than before, and spawns nothing."""

from __future__ import annotations

from rsc_health.config import Config


def job_nodes(env) -> int:
    """The job's node count from the prolog's environment (SLURM_JOB_NUM_NODES, SLURM_NNODES,
    else SLURM_JOB_NODELIST counted without expanding it); 0 when none says."""
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        text = (env.get(key) or "").strip()
        if text.isdigit() and len(text) < 10:
            return int(text)
    from rsc_health.hostlist import HostlistError, count

    try:
        return count((env.get("SLURM_JOB_NODELIST") or "")[:65536])
    except HostlistError:
        return 0


def lite_diag_level(cfg: Config) -> int:
    """The DCGM diagnostic level of the [qualify] lite tier: the highest `-r N` among its tests
    with the dcgm_diag plug-in. 0: none."""
    tests = cfg.get("qualify.tests") or {}
    deepest = 0
    for name in cfg.get("qualify.lite") or []:
        spec = tests.get(name) if isinstance(tests, dict) else None
        if not isinstance(spec, dict) or spec.get("plugin") != "dcgm_diag":
            continue
        argv = [str(a) for a in spec.get("command") or []]
        for flag, value in zip(argv, argv[1:]):
            if flag in ("-r", "--run") and value.isdigit():
                deepest = max(deepest, min(int(value), 4))
    return deepest


def prolog_lite(cfg: Config, families, env):
    """(families, cfg) for this prolog: with the dcgm family and DCGM's diagnostic at the lite
    tier's level for a big job, else as they were. A DCGM Fail drains the node (the job starts
    elsewhere); a diagnostic that could not run is a checker error, never a drain."""
    least = int(cfg.get("qualify.prolog_lite_min_nodes"))
    run_r = lite_diag_level(cfg) if least > 0 and job_nodes(env) >= least else 0
    if run_r <= 0:
        return families, cfg
    import copy  # only for a big job's lite tier: copy brings weakref, types and copyreg

    data = copy.deepcopy(cfg.data)
    dcgm = data.setdefault("dcgm", {})
    dcgm.update(enabled=True, diag_level=max(run_r, int(cfg.get("dcgm.diag_level"))))
    dcgm.update(timeout_s=min(float(cfg.get("dcgm.timeout_s")),
                              float(cfg.get("qualify.prolog_lite_timeout_s"))))
    only = list(families) if families else None
    if only is not None and "dcgm" not in only:
        only.append("dcgm")
    return only, Config(data, cfg.path, cfg.overrides)
