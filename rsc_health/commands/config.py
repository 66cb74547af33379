"""`healthctl config check | show`: is the config what the operator meant, and what does one
node actually run with? Standard library and click only (it runs on compute nodes)."""

from __future__ import annotations

import json
import sys

import click


@click.group()
def config() -> None:
    """Validate the site config, or print the effective config of a node."""


@config.command("check")
@click.pass_obj
def config_check(obj) -> None:
    """Load and validate the config (types, ranges, unknown keys, every [nodes."GLOB"] and
    [partitions.NAME] table). Exit 0 when it is usable, 4 (checker error) when it is not,
    with one line naming the file and the key."""
    from rsc_health.config import ConfigError, load_config

    try:
        cfg = load_config(obj.config_path)
    except ConfigError as exc:
        click.echo(f"config error: {exc}", err=True)
        sys.exit(4)
    nodes = len(cfg.overrides.get("nodes", {}))
    parts = len(cfg.overrides.get("partitions", {}))
    click.echo(f"{cfg.path or 'packaged defaults only'}: ok ({nodes} node override(s), "
               f"{parts} partition override(s))")


@config.command("show")
@click.option("--node", "node", help="Node name (default: this node, as the sweep names it).")
@click.option("--partition", help="Apply [partitions.NAME] as the prolog does for its jobs.")
@click.option("--section", help="Only this section.")
@click.pass_obj
def config_show(obj, node: str | None, partition: str | None, section: str | None) -> None:
    """The effective config of one node: packaged defaults, the site file, then its
    [partitions.NAME] and matching [nodes."GLOB"] overrides, as JSON. Secrets are masked
    (a database URL's password, any key named like password, secret or token)."""
    from rsc_health.config import masked, resolve_node_config

    cfg, name = resolve_node_config(obj.config, node=node, partition=partition)
    data = cfg.data if not section else {section: cfg.data.get(section, {})}
    click.echo(json.dumps({"node": name, "partition": partition, "source": str(cfg.path or ""),
                           "config": masked(data)}, indent=2, sort_keys=True, default=str))
