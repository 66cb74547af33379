"""The packaged TOML files reach a prolog as bytecode (rsc_health/_packaged.py, written by
scripts/gen-packaged), never as a stale copy: the literal is current (else this fails and says
to run the script), equal to what tomllib makes of each file, fresh on every call, and used only
for the exact bytes it was made from: a changed defaults file is parsed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rsc_health import compat, config, xid
from rsc_health.compat import tomllib

REPO = Path(__file__).resolve().parents[2]


def test_the_generated_literals_are_current():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-packaged"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr  # "stale: run scripts/gen-packaged"


def test_each_literal_is_what_tomllib_makes_of_its_file_and_fresh_each_time():
    for name in (config.PACKAGED_DEFAULTS, xid.CATALOG_PATH, xid.SXID_CATALOG_PATH):
        path = Path(name)  # the product's paths are str (issue 25: no pathlib on the node)
        data = path.read_bytes()
        tree = compat.packaged_toml(data)
        assert tree == tomllib.loads(data.decode("utf-8")), path.name
        tree.clear()
        assert compat.packaged_toml(data) == tomllib.loads(data.decode("utf-8"))


def test_bytes_that_differ_by_one_character_are_parsed_not_taken_from_the_literal(
        tmp_path, monkeypatch):
    data = Path(config.PACKAGED_DEFAULTS).read_bytes()
    assert compat.packaged_toml(data + b"\n") is None
    edited = tmp_path / "default_config.toml"
    edited.write_bytes(data.replace(b"spool_max_mb = 64", b"spool_max_mb = 65", 1))
    monkeypatch.setattr(config, "PACKAGED_DEFAULTS", edited)
    site = tmp_path / "site.toml"
    site.write_text("")
    assert config.load_config(site).get("node.spool_max_mb") == 65


def test_the_defaults_a_job_start_reads_before_its_config_are_the_trees_and_only_for_its_bytes(
        tmp_path, monkeypatch):
    from rsc_health._packaged_keys import HOT

    tree = tomllib.loads(Path(config.PACKAGED_DEFAULTS).read_text())
    for dotted, value in HOT.items():
        section, key = dotted.split(".")
        assert value == tree[section][key], dotted
    monkeypatch.setattr(config, "_PACKAGED", [])  # no tree built yet: HOT answers
    assert config.packaged_default("slurm.prolog_budget_s") == tree["slurm"]["prolog_budget_s"]
    assert config._PACKAGED == []
    edited = tmp_path / "default_config.toml"
    edited.write_bytes(Path(config.PACKAGED_DEFAULTS).read_bytes().replace(
        b"prolog_budget_s = 30", b"prolog_budget_s = 31", 1))
    monkeypatch.setattr(config, "PACKAGED_DEFAULTS", str(edited))
    assert config.packaged_default("slurm.prolog_budget_s") == 31  # other bytes: parsed
    monkeypatch.setattr(config, "_PACKAGED", [])
    monkeypatch.setattr(config, "PACKAGED_DEFAULTS", str(tmp_path / "missing.toml"))
    try:
        config.packaged_default("slurm.prolog_budget_s")
    except config.ConfigError as exc:  # what an unreadable file always said
        assert "missing.toml" in str(exc)
    else:
        raise AssertionError("an unreadable default_config.toml went unsaid")


def test_the_packaged_catalogs_are_built_when_first_used_as_tomllib_reads_them():
    for load, path in ((xid.load_catalog, xid.CATALOG_PATH),
                       (xid.load_sxid_catalog, xid.SXID_CATALOG_PATH)):
        catalog = load()
        assert "not built yet" in repr(catalog)
        expect = tomllib.loads(Path(path).read_text())
        xid._validate(expect, path)  # the packaged catalog is one that validates
        assert catalog.data == expect
        assert "built" in repr(catalog) and "not built" not in repr(catalog)
    rule = xid.load_catalog().rule(79)
    assert (rule.severity, rule.repair) == (xid.Severity.DRAIN_NOW, True)
