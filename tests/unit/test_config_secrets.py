"""`healthctl config show` prints what a node runs with, never the database's password."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.config import MASK, masked

SECRET = "s3:cr@t-Pw"


def test_config_show_masks_the_database_password(tmp_path):
    """It printed `postgresql+psycopg://rsc:PASSWORD@dbhost/...` whole (issue 21)."""
    site = tmp_path / "site.toml"
    site.write_text(f'[historian]\nurl = "postgresql+psycopg://rsc:{SECRET}@dbhost:5432/rsc"\n'
                    f'[nodes."gpu*".historian]\nurl = "postgresql://n:{SECRET}@pgb/rsc"\n')
    for args in (["--node", "cpu1"], ["--node", "gpu7", "--section", "historian"]):
        result = CliRunner().invoke(cli, ["--config", str(site), "config", "show", *args])
        assert result.exit_code == 0, result.output
        assert SECRET not in result.output and "s3" not in result.output
        url = json.loads(result.output)["config"]["historian"]["url"]
        assert url in (f"postgresql+psycopg://rsc:{MASK}@dbhost:5432/rsc",
                       f"postgresql://n:{MASK}@pgb/rsc")


def test_keys_named_like_secrets_and_libpq_passwords_are_masked_and_the_rest_kept():
    doc = {"a": {"db_password": "x", "api_token": "y", "client_secret": "z", "count": 8,
                 "dsn": "host=db password='p w' user=rsc", "plain": "sqlite:////var/h.db",
                 "list": ["https://u:pw@h/x", "https://u@h/x"], "empty_token": ""}}
    assert masked(doc) == {"a": {
        "db_password": MASK, "api_token": MASK, "client_secret": MASK, "count": 8,
        "dsn": f"host=db password={MASK} user=rsc", "plain": "sqlite:////var/h.db",
        "list": [f"https://u:{MASK}@h/x", "https://u@h/x"], "empty_token": ""}}
