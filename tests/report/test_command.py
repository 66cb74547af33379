"""`healthctl report` end to end through the CLI, and the shipped cron/systemd examples."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

from .test_gather import LEMON_RULES, engine  # noqa: F401 - the populated-historian fixture

CHECKS = Path(__file__).resolve().parents[2] / "checks"


def _invoke(db_url: str, config: Path, *args: str):
    return CliRunner().invoke(cli, ["--config", str(config), "--db", db_url, "report", *args],
                              catch_exceptions=False)


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    lines = ["[lemon]"] + [f"{k} = {json.dumps(v)}" for k, v in LEMON_RULES.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.usefixtures("figures_not_drawn")  # drawn by the README test's `healthctl report`
def test_report_command_writes_the_page_and_prints_the_summary(engine, tmp_path):  # noqa: F811
    out = tmp_path / "report"
    config = _config(tmp_path)
    result = _invoke(str(engine.url), config, "--out", str(out), "--as-of", "2024-06-30")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("rsc-health lemon report 2024-06-30 (28-day window)")
    assert "gpu001" in result.stdout
    assert (out / "report.html").exists() and (out / "summary.txt").exists()
    document = json.loads((out / "report.json").read_text())
    assert [r["node"] for r in document["lemons"]] == ["gpu001"]

    again = _invoke(str(engine.url), config, "--out", str(out), "--as-of", "2024-07-01",
                    "--embed")
    assert again.exit_code == 0, again.output
    assert "new since 2024-06-30 00:00:00: 0" in again.stdout
    assert 'src="data:image/png;base64,' in (out / "report.html").read_text()


def _locked(*args, **kwargs):
    from sqlalchemy.exc import OperationalError

    raise OperationalError("SELECT ...", {}, Exception("database is locked"))


@pytest.mark.usefixtures("figures_not_drawn")
def test_a_lemon_section_the_historian_failed_does_not_clear_yesterdays_candidates(
        engine, tmp_path, monkeypatch):  # noqa: F811
    """The lemon verdicts fail one night (the historian locked past its busy timeout, a
    statement timeout): summary.txt said "Lemon candidates: 0 ... No longer candidates:
    gpu001" and report.json kept no candidate, so the next night called gpu001 NEW, listed 1
    day: the pull list's age (its order) was lost to one transient error. Now the night says
    the verdicts are unknown, carries gpu001 on, and exits 1 for the timer to show."""
    import rsc_health.historian.lemons.verdicts as verdicts

    out, config = tmp_path / "report", _config(tmp_path)
    first = _invoke(str(engine.url), config, "--out", str(out), "--as-of", "2024-06-30", "-q")
    assert first.exit_code == 0, first.output
    assert [r["node"] for r in json.loads((out / "report.json").read_text())["lemons"]] == [
        "gpu001"]

    real = verdicts.lemon_verdicts
    monkeypatch.setattr(verdicts, "lemon_verdicts", _locked)
    failed = _invoke(str(engine.url), config, "--out", str(out), "--as-of", "2024-07-01", "-q")
    assert failed.exit_code == 1, failed.output
    assert "failed: lemons" in failed.stderr
    assert "No longer candidates: gpu001" not in failed.stdout, failed.stdout
    assert "cleared: 1" not in failed.stdout, failed.stdout
    assert "Lemon candidates: unknown (lemon verdicts unavailable: OperationalError" \
        in failed.stdout
    assert "last known (as of 2024-06-30 00:00:00): gpu001" in failed.stdout
    html = (out / "report.html").read_text()
    assert "Lemon candidates unknown tonight: lemon verdicts unavailable" in html
    assert "No lemon candidates today" not in html
    carried = json.loads((out / "report.json").read_text())
    assert [r["node"] for r in carried["lemons"]] == ["gpu001"]
    assert carried["lemons_as_of"] == "2024-06-30 00:00:00"

    monkeypatch.setattr(verdicts, "lemon_verdicts", real)
    after = _invoke(str(engine.url), config, "--out", str(out), "--as-of", "2024-07-02", "-q")
    assert after.exit_code == 0, after.output
    line = next(ln for ln in after.stdout.splitlines() if ln.strip().startswith("gpu001"))
    assert "NEW" not in line, after.stdout
    row = next(r for r in json.loads((out / "report.json").read_text())["lemons"]
               if r["node"] == "gpu001")
    assert row["days_listed"] >= 3, row


@pytest.mark.usefixtures("figures_not_drawn")
def test_an_actions_section_the_historian_failed_is_not_reported_as_no_drains(
        engine, tmp_path, monkeypatch):  # noqa: F811
    """The last day's actions could not be read: summary.txt said "Actions in the last day:
    none" and the page "No drains or resumes by rsc-health in the last day.", the all-clear
    an operator reads after a fleet event, when the truth is unknown."""
    import rsc_health.report.gather as gather

    monkeypatch.setattr(gather, "recent_actions", _locked)
    out, config = tmp_path / "report", _config(tmp_path)
    result = _invoke(str(engine.url), config, "--out", str(out), "--as-of", "2024-06-30", "-q")
    assert result.exit_code == 1, result.output
    assert "Actions in the last day: none" not in result.stdout, result.stdout
    assert "Actions in the last day: unknown (recent actions unavailable: OperationalError" \
        in result.stdout
    html = (out / "report.html").read_text()
    assert "No drains or resumes by rsc-health in the last day." not in html
    assert "recent actions unavailable: OperationalError" in html


@pytest.mark.usefixtures("figures_not_drawn")
@pytest.mark.parametrize("text", ["[" * 50_000, "[1, 2]"], ids=["nested-too-deep", "array"])
def test_a_previous_report_json_that_is_no_report_is_no_previous_report(
        engine, tmp_path, text):  # noqa: F811
    """Last night's report.json is read for "new since"; a bad one must not stop tonight's
    report, and one nested too deep (RecursionError, not ValueError) or holding an array
    (AttributeError: 'list' object has no attribute 'get') did."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text(text)

    result = _invoke(str(engine.url), _config(tmp_path), "--out", str(out),
                     "--as-of", "2024-06-30")

    assert result.exit_code == 0, result.output
    assert "gpu001" in result.stdout
    assert [r["node"] for r in json.loads((out / "report.json").read_text())["lemons"]] == [
        "gpu001"]


def test_report_command_refuses_a_directory_anyone_may_write_before_gathering(
        engine, tmp_path, monkeypatch):  # noqa: F811
    """report.html and the rest go through durable.write_atomic; a directory others may write
    without the sticky bit is refused in one line, before the gathering, with nothing in it."""
    import rsc_health.report.gather as gather_mod

    out = tmp_path / "report"
    out.mkdir()
    out.chmod(0o777)
    monkeypatch.setattr(gather_mod, "gather", lambda *a, **k: pytest.fail("gathered"))
    result = CliRunner().invoke(cli, ["--config", str(_config(tmp_path)), "--db",
                                      str(engine.url), "report", "--out", str(out)])
    assert result.exit_code == 1
    assert f"cannot write the report: {out} is writable by others (mode 777): refused" in (
        result.output)
    assert list(out.iterdir()) == []


def test_report_command_names_an_unreachable_database(tmp_path):
    result = CliRunner().invoke(
        cli, ["--config", "/dev/null", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x",
              "report", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "Error:" in result.output and "127.0.0.1" in result.output


def _shipped_args(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if "healthctl" in ln and not ln.startswith("#"))
    words = shlex.split(line)
    return words[next(i for i, w in enumerate(words) if w.endswith("healthctl")) + 1:]


@pytest.mark.usefixtures("figures_not_drawn")
def test_shipped_cron_and_systemd_examples_run_the_report(engine, tmp_path):  # noqa: F811
    timer = (CHECKS / "rsc-health-report.timer").read_text()
    assert re.search(r"^OnCalendar=", timer, re.M)
    service = (CHECKS / "rsc-health-report.service").read_text()
    assert "Type=oneshot" in service
    for name in ("rsc-health-report.cron", "rsc-health-report.service"):
        args = _shipped_args((CHECKS / name).read_text().replace("ExecStart=", ""))
        assert args[args.index("--config") + 1] == "/etc/rsc_health/config.toml"
        # Run exactly what ships, pointed at a scratch config, database and directory.
        args[args.index("--config") + 1] = "/dev/null"
        args[args.index("--out") + 1] = str(tmp_path / name)
        result = CliRunner().invoke(cli, ["--db", str(engine.url), *args],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert (tmp_path / name / "report.html").exists()
