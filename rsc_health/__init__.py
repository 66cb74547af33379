"""rsc-health: GPU node health checks and lemon-node detection for Slurm clusters."""

__version__ = "0.1.0"


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and what is wrong.
    rsc_health.config raises it, and so does rsc_health.config_schema, which a job start that
    finds its compiled config never loads (25 KB of bytecode: tests/node/test_node_imports.py);
    it lives here, in the package both already import, so the schema does not import the
    module that imports it (tests/unit/test_import_graph.py). Import it from rsc_health.config."""
