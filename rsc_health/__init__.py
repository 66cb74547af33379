"""rsc-health: GPU node health checks and lemon-node detection for Slurm clusters."""

__version__ = "0.1.0"
