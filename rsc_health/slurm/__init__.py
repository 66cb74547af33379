"""Every call rsc-health makes to Slurm goes through this package.

`SlurmAPI` is the small interface the action layer, the node path and the CLI use; `CliSlurm`
implements it with Slurm's own commands (scontrol, sinfo, squeue, sacct, sacctmgr) on 22.05 and
newer. pyslurm could sit behind the same interface where its version matches the site's Slurm.
"""

from __future__ import annotations

from rsc_health.slurm.api import (
    JobGone,
    JobInfo,
    NodeInfo,
    RequeueRefused,
    ShadowMode,
    SlurmAPI,
    SlurmCommandError,
    SlurmError,
    SlurmUnavailable,
)
from rsc_health.slurm.cli_backend import CliSlurm

__all__ = [
    "CliSlurm",
    "JobGone",
    "JobInfo",
    "NodeInfo",
    "RequeueRefused",
    "SlurmAPI",
    "SlurmCommandError",
    "SlurmError",
    "SlurmUnavailable",
    "ShadowMode",
    "from_config",
]


def from_config(cfg, *, timeout_s: float | None = None) -> CliSlurm:
    """The Slurm backend the config asks for ([slurm] call_timeout_s, bin_dir): the one door
    to Slurm for the node path, the operator's commands and, through `.accounting()`, the
    historian's sacct and sacctmgr. In shadow mode ([actions] enabled = false) it only reads:
    any change (scontrol update/create/delete/requeue/reboot, sbatch, scancel) raises
    ShadowMode before a command runs, whichever caller asks."""
    return CliSlurm(
        timeout_s=float(
            timeout_s if timeout_s is not None else cfg.get("slurm.call_timeout_s")
        ),
        bin_dir=cfg.get("slurm.bin_dir") or None,
        # Read-only unless some node may be changed (the site, or a pilot's nodes inside a
        # site in shadow mode); the rest refused per node (shadow_node)
        read_only=not (cfg.actions_enabled_anywhere() if hasattr(cfg, "actions_enabled_anywhere")
                       else cfg.get("actions.enabled")),
        shadow_node=((lambda node: not cfg.actions_enabled(node))
                     if hasattr(cfg, "actions_enabled") else None),
    )
