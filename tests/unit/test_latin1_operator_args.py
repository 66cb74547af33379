"""Python decodes argv with surrogateescape: an operator typing (or pasting from a Latin-1
terminal) `healthctl ticket open gpu001 --reason 'carte mère HS'` hands the command a str with
lone surrogates. The ingest paths turn such bytes into U+FFFD (free_text / the CSV readers'
errors='replace'); `ticket open` stores it as is and the SQLite/psycopg driver raises
UnicodeEncodeError: the ticket is not opened and the operator gets a generic
'healthctl: error: UnicodeEncodeError' from cli.main's last-resort net. `triage --node` and
`ticket list --node` with such a name die the same way instead of saying 'not a node name'."""
import os
import subprocess
import sys

REPO = str(__import__("pathlib").Path(__file__).resolve().parents[2])


def _run(tmp_path, *args: bytes):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    env = dict(os.environ, PYTHONPATH=REPO, LC_ALL="C.UTF-8")
    argv = [sys.executable.encode(), b"-m", b"rsc_health.cli", b"--db", db.encode(), *args]
    return subprocess.run(argv, env=env, capture_output=True, timeout=120, cwd=REPO)


def test_ticket_open_with_a_latin1_reason_opens_the_ticket(tmp_path):
    assert _run(tmp_path, b"db", b"upgrade").returncode == 0
    out = _run(tmp_path, b"ticket", b"open", b"gpu001", b"--reason", b"carte m\xe8re HS")
    assert out.returncode == 0, out.stderr.decode()
    listed = _run(tmp_path, b"ticket", b"list")
    assert b"gpu001" in listed.stdout, listed.stderr.decode()


def test_a_latin1_node_filter_is_refused_in_words_not_an_encode_error(tmp_path):
    assert _run(tmp_path, b"db", b"upgrade").returncode == 0
    for args in ([b"triage", b"--node", b"gpu\xe9"], [b"ticket", b"list", b"--node", b"gpu\xe9"]):
        out = _run(tmp_path, *args)
        assert b"UnicodeEncodeError" not in out.stderr, (args, out.stderr.decode())
