"""`[xid] catalog_override` in the historian: a site marks an XID `application = true` (its
users' programs raise it; the node path, judging by the same merged catalog, never holds it
against the node). The historian read the packaged catalog alone, so a user's storm of that
XID still counted against the node and made a lemon, failed jobs, reliability failures.

Now the historian's rules (OutageRules.of_site) take the application XIDs from the same merge
(xid.load_catalog, the same trust rule). An override this host cannot use (not copied to the
historian host, not root's) is said on stderr and in `healthctl lemons`; the dry run judges by
the packaged catalog, `--apply` drains nothing. Histories go in as `ingest checks` JSON lines
and `ingest sacct` text would, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
from datetime import timedelta

from click.testing import CliRunner
from lemon_fleet import AS_OF, drained, fleet_slurm
from sqlalchemy import select

from rsc_health.cli import AppContext
from rsc_health.commands.historian import attribute as attribute_command
from rsc_health.commands.lemons import lemons
from rsc_health.config import load_config
from rsc_health.historian.attribute import attribute
from rsc_health.historian.ingest import checks
from rsc_health.historian.lemons.features import OutageRules, lemon_features
from rsc_health.historian.lemons.verdicts import LemonRules, lemon_verdicts
from rsc_health.historian.metrics.reliability import failures
from rsc_health.historian.schema import attributions
from rsc_health.historian.triage import HOST, USER, triage

DAY = timedelta(days=1)
# XID 32 (invalid or corrupted push buffer stream) is the node's in the packaged catalog;
# this site's users raise it from their own kernels. Its XID 13 entry replaces the packaged
# one whole (no `application`): the site wants 13 held against the node, as the node path
# then does.
SITE = ('[codes.32]\naction = "warn"\napplication = true\n'
        'name = "Push buffer stream corrupted (our users\' own kernels)"\n'
        '[codes.13]\naction = "drain_after_job"\nname = "Graphics engine exception"\n')


def _site_catalog(tmp_path, text: str = SITE):
    site = tmp_path / "policy" / "xid_site.toml"
    site.parent.mkdir(mode=0o755)
    site.write_text(text)
    site.chmod(0o644)
    return site


def _config_file(tmp_path, override) -> str:
    path = tmp_path / "config.toml"
    path.write_text(f'[xid]\ncatalog_override = "{override}"\n'
                    '[lemon]\nxid_cnt = 3\nstrong = ["xid_cnt"]\n')
    return str(path)


def _xids(engine, rows):
    text = "".join(json.dumps({"time": t.isoformat(), "node": n, "check": "xid",
                               "status": "fail", "code": code, "component": gpu}) + "\n"
                   for n, t, code, gpu in rows)
    report = checks.ingest_lines(engine, io.StringIO(text))
    assert report.written == len(rows), report


def _storms(fleet):
    """n1: a user's XID 32 on six days; n2: XID 79 on five; n3: XID 13 on five."""
    _xids(fleet.engine, [("n1", AS_OF - k * 2 * DAY, "xid32", "gpu2") for k in range(1, 7)])
    _xids(fleet.engine, [("n2", AS_OF - k * 4 * DAY, "xid79", "gpu1") for k in range(1, 6)])
    _xids(fleet.engine, [("n3", AS_OF - k * 3 * DAY, "xid13", "gpu4") for k in range(1, 6)])
    # a job of n1's failing a minute after its last XID 32
    fleet.job(["n1"], state="FAILED", end=AS_OF - 2 * DAY + timedelta(minutes=1))


def test_an_xid_the_sites_catalog_marks_application_is_never_the_nodes(fleet_any, tmp_path):
    engine = fleet_any.engine
    _storms(fleet_any)
    cfg = load_config(_config_file(tmp_path, _site_catalog(tmp_path)))
    rules = OutageRules.of_site(cfg)
    assert rules.xid_catalog_problem == ""
    assert "xid32" in rules.application_xids and "xid13" not in rules.application_xids
    f = lemon_features(engine, AS_OF, outages=rules)
    assert f.loc["n1", ["xid_cnt", "episodes", "left_out"]].tolist() == [0, 0, 6]
    assert f.loc["n3", "xid_cnt"] == 5
    verdicts = lemon_verdicts(engine, f, AS_OF, LemonRules.from_config(cfg.section("lemon")))
    assert sorted(v.node for v in verdicts) == ["n2", "n3"]
    lo, hi = AS_OF - 30 * DAY, AS_OF
    out = failures(engine, lo, hi, rules)
    assert "n1" not in set(out["node"]) and out.attrs["left_out"]["application_xids"] == 6
    jobs = triage(engine, lo, hi, rules=rules)
    assert jobs["label"].tolist() == [USER]
    # The packaged catalog alone (the rules before): n1 a lemon, its job the host's.
    packaged = OutageRules()
    f = lemon_features(engine, AS_OF, outages=packaged)
    assert f.loc["n1", "xid_cnt"] == 6 and f.loc["n3", "xid_cnt"] == 0
    assert triage(engine, lo, hi, rules=packaged)["label"].tolist() == [HOST]


def _lemons_cli(fleet, config: str, *args):
    obj = AppContext(config_path=config, db_url=str(fleet.engine.url))
    obj.slurm = fleet_slurm({n: ("IDLE", "") for n in ("n1", "n2", "n3")}, size=0)
    result = CliRunner().invoke(lemons, ["--as-of", AS_OF.strftime("%Y-%m-%d"), *args],
                                obj=obj)
    return result, obj.slurm


def test_healthctl_lemons_judges_by_the_sites_catalog(fleet_any, tmp_path):
    _storms(fleet_any)
    config = _config_file(tmp_path, _site_catalog(tmp_path))
    result, _ = _lemons_cli(fleet_any, config, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert sorted(v["node"] for v in doc["verdicts"]) == ["n2", "n3"]
    assert doc["warnings"] == []


def test_a_site_catalog_missing_on_the_historian_host_is_said_and_apply_drains_nothing(
        fleet_any, tmp_path):
    """The config names the override the nodes use, but the file was never copied to the
    historian host: the dry run says so and judges by the packaged catalog (n1 listed, with
    the warning to read); --apply fails and drains nothing."""
    _storms(fleet_any)
    missing = tmp_path / "policy" / "xid_site.toml"
    config = _config_file(tmp_path, missing)
    result, _ = _lemons_cli(fleet_any, config)
    assert result.exit_code == 0, result.output
    assert f"WARNING: [xid] catalog_override {missing} not used" in result.output
    assert "n1: xid_cnt=6>=" in result.output
    result, _ = _lemons_cli(fleet_any, config, "--json")
    assert "not used" in json.loads(result.output)["warnings"][0]
    result, slurm = _lemons_cli(fleet_any, config, "--apply")
    assert result.exit_code == 1
    assert "Nothing drained" in result.output and str(missing) in result.output
    assert drained(slurm) == []


def test_a_site_catalog_others_may_write_is_not_used_by_the_historian_either(tmp_path):
    site = _site_catalog(tmp_path)
    site.chmod(0o666)
    rules = OutageRules.of_site(load_config(_config_file(tmp_path, site)))
    assert "refused" in rules.xid_catalog_problem
    assert "xid32" not in rules.application_xids and "xid13" in rules.application_xids


def test_the_report_leaves_the_sites_application_xids_out_as_lemons_does(fleet_any, tmp_path):
    from rsc_health.report.gather import GatherOptions, reliability_section

    _storms(fleet_any)
    cfg = load_config(_config_file(tmp_path, _site_catalog(tmp_path)))
    opts = GatherOptions.from_config(cfg.section("report"), cfg.section("lemon"),
                                     xid=cfg.section("xid"))
    frame = reliability_section(fleet_any.engine, AS_OF, opts)
    assert frame.attrs["left_out"]["application_xids"] == 6


def test_a_lemons_evidence_lists_only_the_xids_held_against_it(fleet_any, tmp_path):
    """An operator reads a candidate's evidence before agreeing to its repair: its XID events
    are those xid_cnt counted. A user's XID 13 storm (the packaged catalog's application
    class) and the site's application XID 32 were listed beside the node's own XID 79, as if
    they were the node's; they are left out now, as the features leave them out."""
    engine = fleet_any.engine
    _xids(engine, [("n2", AS_OF - k * 4 * DAY, "xid79", "gpu1") for k in range(1, 6)])
    _xids(engine, [("n2", AS_OF - k * DAY - timedelta(hours=3), "xid13", "gpu5")
                   for k in range(1, 9)])
    _xids(engine, [("n2", AS_OF - k * DAY - timedelta(hours=5), "xid32", "gpu6")
                   for k in range(1, 4)])
    cfg = load_config(_config_file(tmp_path, _site_catalog(tmp_path, SITE.split("[codes.13]")[0])))
    rules = OutageRules.of_site(cfg)
    assert {"xid13", "xid32"} <= set(rules.application_xids), rules
    f = lemon_features(engine, AS_OF, outages=rules)
    assert f.loc["n2", "xid_cnt"] == 5
    (verdict,) = lemon_verdicts(engine, f, AS_OF, LemonRules.from_config(cfg.section("lemon")))
    listed = verdict.evidence["xid_events"]
    assert sorted({e["code"] for e in listed}) == ["xid79"], listed
    assert len(listed) == 5


def test_healthctl_attribute_blames_no_node_for_an_xid_the_sites_catalog_marks_application(
        fleet_any, tmp_path):
    """n1's failed job ended a minute after the user's XID 32: by the site's catalog the
    program's own error, which `healthctl attribute` holds against no node (r_f, the lemon
    failure features); by the packaged catalog alone, the node's."""
    _storms(fleet_any)
    config = _config_file(tmp_path, _site_catalog(tmp_path))
    obj = AppContext(config_path=config, db_url=str(fleet_any.engine.url))
    result = CliRunner().invoke(attribute_command, [], obj=obj)
    assert result.exit_code == 0, result.output
    with fleet_any.engine.connect() as conn:
        assert conn.execute(select(attributions)).all() == []
    attribute(fleet_any.engine)  # the packaged catalog's application XIDs only
    with fleet_any.engine.connect() as conn:
        assert conn.execute(select(attributions.c.node, attributions.c.code)).all() == [
            ("n1", "xid32")]
