"""Several clusters in one historian: every job and node event names its Slurm cluster, from
[historian] cluster, else the input's Cluster field, else slurm.conf's ClusterName; a row
read before the cluster was known is named when it is read again, never unnamed; metrics
take a cluster."""

from __future__ import annotations

import json

from sqlalchemy import func, select

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


def _jobs_and_nodes(engine) -> dict[str, tuple]:
    J, JN = schema.jobs, schema.job_nodes
    with engine.connect() as conn:
        rows = conn.execute(select(J.c.cluster, J.c.job_id, J.c.state, JN.c.node)
                            .join(JN, JN.c.job_pk == J.c.id)).all()
    out: dict[str, tuple] = {}
    for cluster, job_id, state, node in rows:
        got = out.setdefault(cluster, (job_id, state, []))
        got[2].append(node)
    return {c: (j, s, sorted(n)) for c, (j, s, n) in out.items()}


def test_two_clusters_jobs_with_the_same_id_submit_and_start_are_two_jobs(historian):
    """One historian, two clusters' hourly ingests ([historian] cluster per cluster): alpha's
    job 4711 and beta's job 4711 were submitted and started in the same seconds (two
    clusters set up together count their job ids in step). The instance key was
    JobIDRaw:Submit:Start alone, so beta's job updated alpha's row (or, its end being
    final, vanished into it): one job, alpha's nodes, beta's failure lost. Now each is its
    own job with its own nodes, read again any number of times, from either side; a re-read
    that names no cluster still updates the job it read before, never adds one."""
    alpha = _parsable([_row("4711", NodeList="a[01-02]")])
    beta = _parsable([_row("4711", State="FAILED", ExitCode="1:0", NodeList="b[07-08]")])
    for _ in range(2):
        sacct.ingest_text(historian, alpha, cluster="alpha")
        sacct.ingest_text(historian, beta, cluster="beta")
    assert _jobs_and_nodes(historian) == {
        "alpha": ("4711", "COMPLETED", ["a01", "a02"]),
        "beta": ("4711", "FAILED", ["b07", "b08"])}
    sacct.ingest_text(historian, alpha)  # no cluster named: alpha's row, no third job
    assert len(_jobs_and_nodes(historian)) == 2
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.jobs)).scalar() == 2


def test_one_file_with_two_clusters_jobs_of_one_key_keeps_both(historian):
    """The same collision inside one export (`sacct -M alpha,beta`, its Cluster field naming
    each), into an empty historian and again into the filled one: two jobs each time."""
    rows = [_row("4711", NodeList="a[01-02]"),
            _row("4711", State="FAILED", ExitCode="1:0", NodeList="b[07-08]")]
    text = _parsable(rows).replace("AllocTRES\n", "AllocTRES|Cluster\n")
    lines = text.splitlines()
    text = "\n".join([lines[0], lines[1] + "|alpha", lines[2] + "|beta"]) + "\n"
    for _ in range(2):
        report = sacct.ingest_text(historian, text)
        assert report.written == 2 and report.merged == {}, report  # none merged
        assert _jobs_and_nodes(historian) == {
            "alpha": ("4711", "COMPLETED", ["a01", "a02"]),
            "beta": ("4711", "FAILED", ["b07", "b08"])}
