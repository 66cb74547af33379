"""Job names, user names and peer groups are anyone's text: the rich tables of `healthctl
ettr`, `outcomes` and `reliability` must print them as text. Rich reads "[...]" in a cell as
markup: "[/x]" raised MarkupError (the command died with a traceback, so a user could keep
the operator from seeing ETTR by naming a job), and "[link=...]" made a hyperlink."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from rsc_health.cli import cli

HEADER = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|End|"
          "NNodes|NodeList|AllocTRES")


def _row(job: int, name: str, user: str, start_h: int, hours: int) -> str:
    start = f"2024-03-01T{start_h:02d}:00:00"
    end = f"2024-03-{1 + (start_h + hours) // 24:02d}T{(start_h + hours) % 24:02d}:00:00"
    return (f"{job}|{job}|{name}|{user}|gpu|COMPLETED|0:0|{start}|{start}|{start}|{end}|2|"
            f"gpu[001-002]|billing=16,cpu=192,gres/gpu=256,node=2")


def test_a_job_named_like_rich_markup_is_printed_as_its_name(tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    sacct = tmp_path / "sacct.txt"
    sacct.write_text("\n".join([
        HEADER,
        _row(1, "[/x]", "alice", 0, 12),
        _row(2, "[link=http://evil.example/]click[/link]", "[bold]bob", 1, 11),
    ]) + "\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[ettr]\nmin_run_hours = 1.0\nmin_gpus = 8\n")
    run = CliRunner()
    assert run.invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    loaded = run.invoke(cli, ["--db", db, "ingest", "sacct", "--file", str(sacct)])
    assert loaded.exit_code == 0, loaded.output
    result = run.invoke(cli, ["--config", str(cfg), "--db", db, "ettr", "--rf", "6.5",
                              "--since", "2024-02-01", "--until", "2024-04-01"],
                        env={"COLUMNS": "250"})
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    assert result.exit_code == 0, result.output
    assert "[/x]" in result.output
    assert "[link=http://evil.example/]click[/link]" in result.output
    assert "[bold]bob" in result.output


def test_healthctl_gpus_prints_a_serial_s_terminal_escapes_escaped(tmp_path: Path):
    """A GPU serial is the imported CSV's text: one holding ESC ]0; (retitle) or a newline
    (a forged line) is printed escaped, as every other name healthctl prints."""
    db = f"sqlite:///{tmp_path / 'h.db'}"
    run = CliRunner()
    assert run.invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    events = tmp_path / "events.txt"
    events.write_text("NodeName|TimeStart|TimeEnd|State|Reason\n" + "".join(
        f"{n}|2024-03-{d:02d}T00:00:00|2024-03-{d:02d}T02:00:00|DOWN|GPU\n"
        for n, d in (("n001", 2), ("n001", 5), ("n002", 20))))
    gpus = tmp_path / "gpus.csv"
    serial = "S1\x1b]0;pwned\x07\nS2: 99 failures in n999"
    gpus.write_text("serial,node,slot,from,to\n"
                    f'"{serial}",n001,gpu0,2024-01-01T00:00:00,2024-03-10T00:00:00\n'
                    f'"{serial}",n002,gpu0,2024-03-11T00:00:00,\n')
    assert run.invoke(cli, ["--db", db, "ingest", "events", "--file", str(events)]
                      ).exit_code == 0
    loaded = run.invoke(cli, ["--db", db, "ingest", "gpus", "--file", str(gpus)])
    assert loaded.exit_code == 0, loaded.output
    result = run.invoke(cli, ["--db", db, "gpus", "--until", "2024-04-01"])
    assert result.exit_code == 0, result.output
    assert "1 GPUs failed in more than one node" in result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "S1\\x1b]0;pwned\\x07\\nS2: 99 failures in n999: 3 failures in n001, n002" in (
        result.output)
    assert len(result.output.splitlines()) == 2


def _historian_with_cause(tmp_path: Path, cause: str) -> str:
    """One failed 512-GPU job blamed on a check family named `cause` (a node's text:
    delivery keeps any `check` up to 32 characters). Helper 203."""
    from datetime import datetime, timedelta

    from sqlalchemy import create_engine

    from rsc_health.historian import db, schema

    url = f"sqlite:///{tmp_path / 'h.db'}"
    eng = create_engine(url)
    db.create(eng)
    end = datetime(2024, 3, 10, 12)
    with eng.begin() as conn:
        res = conn.execute(schema.jobs.insert().values(
            job_id="1", job_id_display="1", name="train", user="alice", partition="gpu",
            state="FAILED", exit_code="1:0", submit=end - timedelta(hours=5),
            start=end - timedelta(hours=4), end=end, nnodes=64, gpus=512,
            nodelist="gpu[001-064]", instance_key="1:x:y"))
        conn.execute(schema.attributions.insert().values(
            job_pk=res.inserted_primary_key[0], node="gpu001", cause=cause, code="c",
            evidence="e", kind="check"))
    eng.dispose()
    return url


def _rolling(url: str):
    return CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "rolling",
                                    "--since", "2024-03-01", "--until", "2024-04-01"],
                              env={"COLUMNS": "250"})


def test_rolling_survives_a_check_family_named_like_rich_markup(tmp_path: Path):
    """`rolling` makes each cause a column header; rich read a str header as markup."""
    result = _rolling(_historian_with_cause(tmp_path, "[/x]"))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    assert result.exit_code == 0, result.output
    assert "[/x]" in result.output


def test_rolling_prints_an_escape_in_a_check_family_escaped(tmp_path: Path):
    """ESC ]0;...BEL (retitle the terminal) in a cause reached the terminal raw."""
    result = _rolling(_historian_with_cause(tmp_path, "\x1b]0;pwned\x07x"))
    assert result.exit_code == 0, repr(result.exception)
    assert "\x1b]0;" not in result.output
    assert "\\x1b]0;pwned" in result.output
