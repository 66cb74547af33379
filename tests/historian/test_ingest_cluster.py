"""Several clusters in one historian: every job and node event names its Slurm cluster, from
[historian] cluster, else the input's Cluster field, else slurm.conf's ClusterName; a row
read before the cluster was known is named when it is read again, never unnamed; metrics
take a cluster."""

from __future__ import annotations

import json

from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.ingest import events, sacct
from rsc_health.historian.metrics._sql import Window
from rsc_health.historian.metrics.runs import RunOptions, job_runs
from rsc_health.slurm.accounting import cluster_name

from .test_ingest_adversarial import _json_job, _parsable, _row


def _clusters(engine, table=schema.jobs) -> dict[str, str]:
    key = table.c.job_id if table is schema.jobs else table.c.node
    with engine.connect() as conn:
        return dict(conn.execute(select(key, table.c.cluster)).all())


def test_the_cluster_comes_from_sacct_or_the_config_and_is_never_unnamed(historian):
    rows = [_row("1"), _row("2")]
    text = _parsable(rows)
    sacct.ingest_text(historian, text)  # no Cluster column: unnamed
    assert _clusters(historian) == {"1": "", "2": ""}
    named = text.replace("AllocTRES\n", "AllocTRES|Cluster\n")
    named = "\n".join(line + ("|alpha" if i else "") for i, line in
                      enumerate(named.splitlines())) + "\n"
    sacct.ingest_text(historian, named)  # read again with the Cluster field: named
    assert _clusters(historian) == {"1": "alpha", "2": "alpha"}
    sacct.ingest_text(historian, text)  # a file without it does not unname them
    assert _clusters(historian) == {"1": "alpha", "2": "alpha"}
    sacct.ingest_text(historian, _parsable([_row("3")]), cluster="beta")  # the config's name
    assert _clusters(historian)["3"] == "beta"
    doc = {"jobs": [_json_job(4, "j")]}  # the JSON form names its cluster ("alpha")
    sacct.ingest_text(historian, json.dumps(doc).encode(), default_cluster="ignored")
    assert _clusters(historian)["4"] == "alpha"
    sacct.ingest_text(historian, _parsable([_row("5")]), default_cluster="gamma")
    assert _clusters(historian)["5"] == "gamma"


def test_node_events_name_their_cluster(historian):
    text = ("Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User\n"
            "alpha|gpu001|2024-03-01T08:00:00|Unknown|DRAIN|x|root(0)\n")
    events.ingest_text(historian, text)
    assert _clusters(historian, schema.node_events) == {"gpu001": "alpha"}
    events.ingest_text(historian, text.replace("alpha|", "|"))  # never unnamed
    assert _clusters(historian, schema.node_events) == {"gpu001": "alpha"}
    events.ingest_text(historian, text.replace("gpu001", "gpu002"), cluster="beta")
    assert _clusters(historian, schema.node_events)["gpu002"] == "beta"


def test_metrics_count_one_clusters_jobs(historian):
    long = dict(Start="2024-03-01T08:00:05", End="2024-03-04T08:00:05")
    sacct.ingest_text(historian, _parsable([_row("1", "a", **long)]), cluster="alpha")
    sacct.ingest_text(historian, _parsable([_row("2", "b", **long)]), cluster="beta")
    opts = RunOptions(link_by="job_id")
    assert len(job_runs(historian, 6.5e-3, Window(), opts)) == 2
    alpha = job_runs(historian, 6.5e-3, Window(cluster="alpha"), opts)
    assert alpha["name"].tolist() == ["a"]


def test_cluster_name_reads_slurm_conf(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("# ClusterName=commented\nSlurmctldPort=6817\nClusterName=rsc1 # main\n")
    assert cluster_name(conf) == "rsc1"
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert cluster_name() == "rsc1"
    assert cluster_name(tmp_path / "missing.conf") == ""


def test_healthctl_metrics_take_cluster(tmp_path):
    from click.testing import CliRunner

    from rsc_health.cli import cli

    url = f"sqlite:///{tmp_path / 'h.db'}"
    runner = CliRunner()
    for cluster, job in (("alpha", "1"), ("beta", "2")):
        path = tmp_path / f"{cluster}.txt"
        path.write_text(_parsable([_row(job)]).replace("AllocTRES\n", "AllocTRES|Cluster\n")
                        .replace("node=2\n", f"node=2|{cluster}\n"))
        assert runner.invoke(cli, ["--db", url, "ingest", "sacct", "--file", str(path)]
                             ).exit_code == 0
    both = json.loads(runner.invoke(cli, ["--db", url, "outcomes", "--json"]).output)
    alpha = json.loads(runner.invoke(cli, ["--db", url, "outcomes", "--json",
                                           "--cluster", "alpha"]).output)
    assert sum(r["jobs"] for r in both) == 2, both
    assert sum(r["jobs"] for r in alpha) == 1, alpha
