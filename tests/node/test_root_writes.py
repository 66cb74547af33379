"""Root never writes through a name someone else controls (issue 21, "Root writes through
symlinks planted in directories others can write").

The attacks are real: symlinks and FIFOs planted by an unprivileged uid (nobody, in a forked
child that dropped root) in the directories the node path, the flush, the report and
`metrics export` write into, for every name the old writers used (the textfile's
`.rsc_health.prom.PID` for the next few thousand pids). Root-only files outside must stay as
they were; directories are made with their modes whatever the umask.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rsc_health import durable, nodepath, spool
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SECRET = b"root:$6$not-for-anyone$:19000:0:99999:7:::\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants as another uid: needs root")


def _as_nobody(directory: Path, plant) -> None:
    """Run plant(dir_fd) in a child that is uid/gid nobody, on `directory` opened by root
    (so the child needs no way through the test's 0700 parents, only write access there)."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            plant(dfd)
            code = 0
        finally:
            os._exit(code)
    os.close(dfd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged child could not plant"


def _secret(path: Path) -> Path:
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def _tree(top: Path, skip: Path) -> dict[str, tuple]:
    """Every name under `top` except under `skip`, with what it is, holds and when."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p == skip:
                continue
            st = p.lstat()
            body = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[str(p)] = (st.st_mode, st.st_uid, st.st_mtime_ns, body)
    return out


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    root = copy_node(tmp_path / "node")
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text()
                    + '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n')
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    return root


def _no_slurm(cfg, deadline):
    raise AssertionError("a Slurm call was made")


def _plant_textfile_names(secret: Path):
    """Symlinks at the textfile's name and at the temporary name of the next 3000 pids."""
    first = os.getpid()

    def plant(dfd: int) -> None:
        os.symlink(secret, nodepath.TEXTFILE, dir_fd=dfd)
        for pid in range(first - 50, first + 3000):
            os.symlink(secret, f".{nodepath.TEXTFILE}.{pid}", dir_fd=dfd)

    return plant


# ---- the textfile ------------------------------------------------------------------------------
def test_a_textfile_dir_anyone_may_write_is_refused_and_nothing_outside_changes(
        node_env, tmp_path, capsys):
    """0777, symlinks planted by nobody for the next few thousand pids: on main root wrote the
    textfile through the planted `.rsc_health.prom.PID` (the 0600 secret became metrics)."""
    secret = _secret(tmp_path / "shadow")
    textdir = node_env / "var/lib/node_exporter"
    textdir.mkdir(parents=True)
    textdir.chmod(0o777)
    _as_nobody(textdir, _plant_textfile_names(secret))
    assert (textdir / nodepath.TEXTFILE).lstat().st_uid == NOBODY
    (node_env / NODE_STATE).mkdir()  # made by the run: not what this test is about
    before = _tree(tmp_path, skip=node_env / NODE_STATE)
    before.pop(str(textdir))  # its mtime may change; what it holds is checked below
    planted = sorted(os.listdir(textdir))

    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    after = _tree(tmp_path, skip=node_env / NODE_STATE)
    after.pop(str(textdir))
    assert after == before
    assert secret.read_bytes() == SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(os.listdir(textdir)) == planted
    err = capsys.readouterr().err
    assert f"cannot write the textfile {textdir / nodepath.TEXTFILE}" in err
    assert "writable by others (mode 777): refused" in err


def test_a_sticky_group_dir_with_planted_names_gets_the_textfile_and_nothing_else(
        node_env, tmp_path):
    """A textfile directory shared with a group (root:nogroup 01770, the sticky bit set as the
    rule asks): a group member plants the old writer's names. The kernel's protected_symlinks
    covers only world-writable sticky directories, so only the writer protects here; on main
    the secret was overwritten through `.rsc_health.prom.PID`."""
    secret = _secret(tmp_path / "shadow")
    textdir = node_env / "var/lib/node_exporter"
    textdir.mkdir(parents=True)
    os.chown(textdir, 0, NOBODY)
    textdir.chmod(0o1770)
    _as_nobody(textdir, _plant_textfile_names(secret))
    planted = {n for n in os.listdir(textdir) if n != nodepath.TEXTFILE}

    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    assert secret.read_bytes() == SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o600
    written = textdir / nodepath.TEXTFILE
    st = written.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644
    text = written.read_text()
    assert 'rsc_health_verdict_level{source="sweep"} 0' in text and "root:" not in text
    # the planted links are still links to the secret (never followed, never used), and the
    # writer left no temporary file behind
    assert set(os.listdir(textdir)) - {nodepath.TEXTFILE} == planted
    assert all(os.readlink(textdir / n) == str(secret) for n in planted)


def test_write_atomic_never_opens_a_planted_name_and_keeps_the_mode_whatever_the_umask(
        tmp_path):
    secret = _secret(tmp_path / "secret")
    target = tmp_path / "out" / "file.txt"
    target.parent.mkdir()
    target.symlink_to(secret)
    old = os.umask(0o077)
    try:
        durable.write_atomic(target, "new\n", mode=0o644)
    finally:
        os.umask(old)
    assert secret.read_bytes() == SECRET
    assert not target.is_symlink() and target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(target.parent) == ["file.txt"]


def test_write_atomic_refuses_a_directory_others_own_or_write_without_the_sticky_bit(tmp_path):
    for mode, owner, refused in ((0o777, 0, True), (0o775, 0, True), (0o1777, 0, False),
                                 (0o755, NOBODY, True), (0o755, 0, False)):
        d = tmp_path / f"d{mode:o}-{owner}"
        d.mkdir()
        d.chmod(mode)
        os.chown(d, owner, -1)
        if refused:
            with pytest.raises(durable.UnsafeDirectory, match="refused"):
                durable.write_atomic(d / "f", "x")
            assert os.listdir(d) == []
        else:
            durable.write_atomic(d / "f", "x")
            assert (d / "f").read_text() == "x"


# ---- the spool -------------------------------------------------------------------------------
def test_append_never_follows_a_planted_pending_jsonl(tmp_path):
    """On main the records were appended to whatever pending.jsonl pointed at."""
    secret = _secret(tmp_path / "secret")
    sdir = tmp_path / "spool"
    sdir.mkdir()
    (sdir / spool.PENDING).symlink_to(secret)
    with pytest.raises(OSError, match="symlink"):
        spool.append(sdir, [{"kind": "check", "n": 1}])
    assert secret.read_bytes() == SECRET
    (sdir / spool.PENDING).unlink()
    (sdir / spool.PENDING).symlink_to(tmp_path / "created-by-root")  # dangling
    with pytest.raises(OSError, match="symlink"):
        spool.append(sdir, [{"kind": "check", "n": 1}])
    assert not (tmp_path / "created-by-root").exists()


def _flush(root: Path, db: Path | None, *, env: dict | None = None, umask: int = -1,
           config: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "RSC_HEALTH_ROOT": str(root), **(env or {})}
    if config is not None:
        full["RSC_HEALTH_CONFIG"] = str(config)
    args = [sys.executable, "-m", "rsc_health.cli"]
    if db is not None:
        args += ["--db", f"sqlite:///{db}"]
    return subprocess.run(args + ["spool", "flush"], env=full, capture_output=True,
                          text=True, timeout=timeout, umask=umask)


def _node_with_spool(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "node"
    sdir = root / NODE_STATE / "spool"
    sdir.mkdir(parents=True)
    (tmp_path / "cfg.toml").write_text("")
    return root, sdir


def test_a_fifo_named_like_a_batch_does_not_block_the_flush(tmp_path):
    """On main `spool flush` opened the FIFO to read it and waited for a writer for ever."""
    root, sdir = _node_with_spool(tmp_path)
    os.mkfifo(sdir / "batch-20240301T000000000000.jsonl")
    os.mkfifo(sdir / spool.PENDING)
    good = spool.record("job_end", "node01", datetime.now(UTC), job_id="7")
    (sdir / "batch-20240301T000000000001.jsonl").write_text(json.dumps(good) + "\n")

    try:
        done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("spool flush blocked on a FIFO")
    assert done.returncode == 0, done.stderr
    assert "job_end 1" in done.stdout
    aside = sorted(p.name for p in sdir.iterdir() if ".not-a-file-" in p.name)
    assert [n.split(".not-a-file-")[0] for n in aside] == [
        "batch-20240301T000000000000.jsonl", spool.PENDING]
    assert all(stat.S_ISFIFO((sdir / n).lstat().st_mode) for n in aside)


def test_a_symlinked_secret_is_never_delivered_nor_copied_into_quarantine(tmp_path):
    """On main the secret's lines (not JSON) were quarantined, in a 0644 file."""
    root, sdir = _node_with_spool(tmp_path)
    secret = _secret(tmp_path / "shadow")
    (sdir / "batch-20240301T000000000000.jsonl").symlink_to(secret)
    (sdir / spool.PENDING).symlink_to(secret)
    (sdir / "batch-20240301T000000000001.jsonl").write_text("not a record\n")

    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml", umask=0)

    assert done.returncode == 0, done.stderr
    assert secret.read_bytes() == SECRET
    for path in sdir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"not-for-anyone" not in path.read_bytes(), path
    qdir = sdir / "quarantine"
    quarantined = qdir / "batch-20240301T000000000001.jsonl"
    assert "not a record" in quarantined.read_text()
    assert stat.S_IMODE(qdir.stat().st_mode) == 0o700  # made under umask 000
    assert stat.S_IMODE(quarantined.stat().st_mode) == 0o600


# ---- the spool: files and directories another user owns ---------------------------------
def _forged(node: str) -> bytes:
    """A record naming any node, as a user with a way into the spool would write it."""
    rec = spool.record("check", node, datetime.now(UTC), source="sweep", job_id=None,
                       check="xid", component="gpu0", status="fail", severity="drain_now",
                       code="xid79", reason="Xid 79: GPU has fallen off the bus")
    return (json.dumps(rec) + "\n").encode()


def _plant_file(name: str, data: bytes):
    def plant(dfd: int) -> None:  # pragma: no cover - the child
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
        os.write(fd, data)
        os.close(fd)
    return plant


def _sticky_spool(tmp_path: Path) -> tuple[Path, Path]:
    """A node whose spool anyone may write, sticky: DIRECTORY_RULE lets root write there."""
    root, sdir = _node_with_spool(tmp_path)
    sdir.chmod(0o1777)
    return root, sdir


def _delivered_nodes(db: Path) -> set[str]:
    """The nodes the historian holds check records of (none: a flush that found nothing to
    deliver made no schema, or no database)."""
    import sqlite3

    if not db.exists():
        return set()
    conn = sqlite3.connect(db)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'check_results'"
                            ).fetchall():
            return set()
        return {node for (node,) in conn.execute("SELECT node FROM check_results")}
    finally:
        conn.close()


def _own_record(sdir: Path, node: str = "node01") -> None:
    spool.append(sdir, [spool.record("check", node, datetime.now(UTC), source="sweep",
                                     job_id=None, check="ecc", component="*", status="ok",
                                     severity="none", code="", reason="all clear")])


def test_a_batch_or_lock_another_user_planted_in_a_sticky_spool_is_set_aside_not_delivered(
        tmp_path):
    """Found by helper-116: the flush (root) delivered every batch-*.jsonl in the spool,
    whoever owned it: an XID 79 forged for any node."""
    root, sdir = _sticky_spool(tmp_path)
    _own_record(sdir)
    _as_nobody(sdir, _plant_file("batch-20000101T000000000000.jsonl", _forged("gpu777")))
    _as_nobody(sdir, _plant_file(spool.FLUSH_LOCK, b""))
    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
    assert done.returncode == 0, done.stderr
    assert _delivered_nodes(tmp_path / "h.db") == {"node01"}
    aside = sorted(p.name.split(".not-ours-")[0] for p in sdir.iterdir()
                   if ".not-ours-" in p.name)
    assert aside == [spool.FLUSH_LOCK, "batch-20000101T000000000000.jsonl"]
    assert (sdir / spool.FLUSH_LOCK).stat().st_uid == 0  # the flush's own lock, made anew


def test_a_batch_given_to_another_user_since_the_claim_is_not_read(tmp_path):
    sdir = tmp_path / "spool"
    _own_record(sdir)
    [batch] = spool.claim(sdir)
    os.chown(batch, NOBODY, NOBODY)
    with pytest.raises(OSError, match="owned by uid 65534"):
        list(spool.read_batch(batch))


def test_a_pending_jsonl_another_user_made_first_is_not_appended_to_then_set_aside(tmp_path):
    """Found by helper-116: root appended the node's records to it, and the flush delivered
    the forged line it began with."""
    root, sdir = _sticky_spool(tmp_path)
    _as_nobody(sdir, _plant_file(spool.PENDING, _forged("gpu778")))
    _own_record(sdir)  # into a batch of its own
    assert (sdir / spool.PENDING).read_bytes().count(b"\n") == 1  # nothing appended
    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
    assert done.returncode == 0, done.stderr
    assert _delivered_nodes(tmp_path / "h.db") == {"node01"}
    assert [p.name.split(".not-ours-")[0] for p in sdir.iterdir()
            if ".not-ours-" in p.name] == [spool.PENDING]
    _own_record(sdir, node="node02")  # the node's next append makes its own pending.jsonl
    assert (sdir / spool.PENDING).stat().st_uid == 0
    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
    assert done.returncode == 0, done.stderr
    assert _delivered_nodes(tmp_path / "h.db") == {"node01", "node02"}


def test_the_flush_refuses_a_spool_directory_another_user_owns_as_append_does(tmp_path):
    """Found by helper-116: append refused it; the flush read from it and wrote its lock,
    batch renames and quarantine/ there."""
    root, sdir = _node_with_spool(tmp_path)
    (sdir / spool.PENDING).write_bytes(_forged("gpu779") + b"garbage\n")
    os.chown(sdir, NOBODY, NOBODY)
    with pytest.raises(durable.UnsafeDirectory):
        _own_record(sdir)
    before = sorted(p.name for p in sdir.iterdir())
    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
    assert done.returncode != 0
    assert "owned by uid 65534" in done.stderr and durable.DIRECTORY_RULE in done.stderr
    assert sorted(p.name for p in sdir.iterdir()) == before == [spool.PENDING]
    assert _delivered_nodes(tmp_path / "h.db") == set()


def test_a_quarantine_directory_another_user_made_in_a_sticky_spool_gets_no_lines(tmp_path):
    root, sdir = _sticky_spool(tmp_path)
    _own_record(sdir)
    with open(sdir / spool.PENDING, "ab") as fh:
        fh.write(b"not a record\n")

    def plant(dfd: int) -> None:  # pragma: no cover - the child
        os.mkdir("quarantine", 0o777, dir_fd=dfd)
        os.chmod("quarantine", 0o777, dir_fd=dfd)
    _as_nobody(sdir, plant)
    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
    assert done.returncode == 0, done.stderr
    assert "could not be kept" in done.stdout and "owned by uid 65534" in done.stdout
    assert list((sdir / "quarantine").iterdir()) == []
    assert _delivered_nodes(tmp_path / "h.db") == {"node01"}


# ---- directories made whatever the umask -----------------------------------------------------
def test_state_and_spool_dirs_are_not_0777_under_umask_000(node_env):
    """On main, under umask 000 the state dir and the spool came out 0777 (anyone could plant
    a pending verdict or a symlink in them)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], env=env,
                          capture_output=True, text=True, timeout=120, umask=0)
    assert done.returncode == 0, done.stderr
    state = node_env / NODE_STATE
    assert stat.S_IMODE(state.stat().st_mode) == 0o755
    assert stat.S_IMODE((state / "spool").stat().st_mode) == 0o750
    assert stat.S_IMODE((state / "spool" / spool.PENDING).stat().st_mode) == 0o640
    assert stat.S_IMODE((state / "counters.json").stat().st_mode) == 0o644
    text = node_env / "var/lib/node_exporter" / nodepath.TEXTFILE
    assert stat.S_IMODE(text.stat().st_mode) == 0o644
    assert stat.S_IMODE(text.parent.stat().st_mode) == 0o755


def test_a_state_dir_left_0777_is_mended_and_said(node_env, capsys):
    state = node_env / NODE_STATE
    (state / "spool").mkdir(parents=True)
    state.chmod(0o777)
    (state / "spool").chmod(0o777)

    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    assert stat.S_IMODE(state.stat().st_mode) == 0o755
    assert stat.S_IMODE((state / "spool").stat().st_mode) == 0o750
    err = capsys.readouterr().err
    assert f"{state} was writable by group or others (mode 777): made 755" in err
    assert f"{state / 'spool'} was writable by group or others (mode 777): made 750" in err


# ---- the report and `metrics export` ---------------------------------------------------------
def _shared_dir(path: Path) -> Path:
    """A directory shared with a group, as the rule asks of one: root:nogroup 01770."""
    path.mkdir(parents=True)
    os.chown(path, 0, NOBODY)
    path.chmod(0o1770)
    return path


def test_the_report_is_never_written_through_names_planted_in_its_directory(tmp_path):
    """On main report.html and summary.txt were written in place, report.json through the
    fixed report.json.tmp and each PNG by savefig's own open: all followed a planted symlink."""
    from rsc_health.report import plots
    from rsc_health.report.render import write_report
    from tests.report.conftest import build_report_data

    secret = _secret(tmp_path / "shadow")
    out = _shared_dir(tmp_path / "report")
    names = ["report.html", "summary.txt", "report.json.tmp"]
    names += [name for name, _, _ in plots.FIGURES.values()]

    def plant(dfd: int) -> None:
        for name in names:
            os.symlink(secret, name, dir_fd=dfd)

    _as_nobody(out, plant)

    written = write_report(build_report_data(), out)

    assert secret.read_bytes() == SECRET
    for path in (written.html, written.summary, written.json,
                 *(out / f.file for f in written.figures)):
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0, path
    assert "root:" not in written.summary.read_text()


def test_metrics_export_is_never_written_through_names_planted_for_the_next_pids(tmp_path):
    """On main the export went through `.fleet.prom.PID`: planted for the next 3000 pids, the
    export's own pid was among them and root wrote the fleet metrics into the secret."""
    secret = _secret(tmp_path / "shadow")
    out = _shared_dir(tmp_path / "textfile")
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())

    def plant(dfd: int) -> None:
        for pid in range(last + 1, last + 3000):
            os.symlink(secret, f".fleet.prom.{pid}", dir_fd=dfd)

    _as_nobody(out, plant)
    from rsc_health.historian import db

    url = f"sqlite:///{tmp_path / 'h.db'}"
    db.connect(url, create_missing=True).dispose()  # an export creates no historian
    done = subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--config", os.devnull,
         "--db", url, "metrics", "export",
         "--out", str(out / "fleet.prom")],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
        timeout=300)

    assert done.returncode == 0, done.stderr
    assert secret.read_bytes() == SECRET
    assert "rsc_health_historian_up" in (out / "fleet.prom").read_text()
    assert stat.S_IMODE((out / "fleet.prom").stat().st_mode) == 0o644


def test_files_another_user_puts_in_a_sticky_spool_do_not_count_toward_the_spool_cap(tmp_path):
    """Noticed in review of the sticky-spool fix: size_bytes counted every file in the spool,
    so a user could put 64 MB there (a sparse file costs them nothing) and the node dropped
    its all-clear rows and heartbeats as if its own flush had been failing for months."""
    from rsc_health.config import Config
    from rsc_health.node.sinks import within_spool_cap

    _, sdir = _sticky_spool(tmp_path)
    _own_record(sdir)
    ours = (sdir / spool.PENDING).stat().st_size

    def plant(dfd: int) -> None:  # pragma: no cover - the child
        fd = os.open("filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
        os.ftruncate(fd, 1 << 30)  # 1 GiB, sparse
        os.close(fd)
    _as_nobody(sdir, plant)
    assert spool.size_bytes(sdir) == ours
    beat = spool.record("heartbeat", "node01", datetime.now(UTC), source="sweep")
    kept, held = within_spool_cap(Config({"node": {"spool_max_mb": 64}}), sdir.parent,
                                  "sweep", [beat])
    assert kept == [beat] and held == ours


def test_a_pending_jsonl_another_user_makes_after_every_flush_costs_the_node_no_record(
        tmp_path):
    """Noticed in review of the sticky-spool fix: append refused a pending.jsonl it had not
    made, so a user who made one again after each flush had the node lose every record it
    spooled (a drain verdict's check records, its heartbeats), though nothing forged got in.
    The node's records now go to a batch file of its own, delivered by the next flush."""
    root, sdir = _sticky_spool(tmp_path)
    for round_ in range(2):
        forged = _forged("gpu778")
        _as_nobody(sdir, _plant_file(spool.PENDING, forged))
        _own_record(sdir, node=f"node0{round_ + 1}")
        _own_record(sdir, node=f"node0{round_ + 1}")
        assert (sdir / spool.PENDING).read_bytes() == forged  # nothing appended to theirs
        done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
        assert done.returncode == 0, done.stderr
        assert _delivered_nodes(tmp_path / "h.db") == {f"node0{n + 1}" for n in
                                                       range(round_ + 1)}
    assert not [p for p in sdir.iterdir() if p.name.startswith("batch-")]  # all delivered


def test_a_planted_symlink_or_fifo_at_pending_jsonl_is_neither_followed_nor_a_lost_record(
        tmp_path):
    root, sdir = _sticky_spool(tmp_path)
    secret = _secret(tmp_path / "secret")

    def plant_link(dfd: int) -> None:  # pragma: no cover - the child
        os.symlink(str(secret), spool.PENDING, dir_fd=dfd)
    _as_nobody(sdir, plant_link)
    _own_record(sdir)
    assert secret.read_bytes() == SECRET
    (sdir / spool.PENDING).unlink()

    def plant_fifo(dfd: int) -> None:  # pragma: no cover - the child
        os.mkfifo(spool.PENDING, 0o666, dir_fd=dfd)
    _as_nobody(sdir, plant_fifo)
    _own_record(sdir, node="node02")
    done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
    assert done.returncode == 0, done.stderr
    assert _delivered_nodes(tmp_path / "h.db") == {"node01", "node02"}


def _plant_dir(dfd: int) -> None:  # pragma: no cover - the child
    os.mkdir(spool.PENDING, 0o755, dir_fd=dfd)


def _plant_socket(dfd: int) -> None:  # pragma: no cover - the child
    import socket

    os.fchdir(dfd)
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(spool.PENDING)


@pytest.mark.parametrize("plant", [_plant_dir, _plant_socket], ids=["directory", "socket"])
def test_a_directory_or_socket_another_user_makes_at_pending_jsonl_costs_no_record(
        tmp_path, plant):
    """Found by helper-130: append sent only EACCES, ELOOP and EINVAL from its open to the
    batch of its own; a directory of theirs at pending.jsonl said EISDIR (a socket ENXIO
    where fs.protected_regular does not say EACCES first) and the append raised: a user who
    made one again after each flush had the node lose every record."""
    root, sdir = _sticky_spool(tmp_path)
    for round_ in range(2):
        _as_nobody(sdir, plant)
        _own_record(sdir, node=f"node0{round_ + 1}")
        done = _flush(root, tmp_path / "h.db", config=tmp_path / "cfg.toml")
        assert done.returncode == 0, done.stderr
        assert _delivered_nodes(tmp_path / "h.db") == {f"node0{n + 1}" for n in
                                                       range(round_ + 1)}
    assert not (sdir / spool.PENDING).exists()  # theirs set aside by each flush


def test_a_pending_jsonl_the_kernel_will_not_let_root_open_costs_no_record(
        tmp_path, monkeypatch):
    """fs.protected_regular (1 under systemd's defaults) refuses root an O_CREAT open of
    another user's file in a sticky directory others may write: EACCES, not our refusal."""
    _, sdir = _sticky_spool(tmp_path)
    _as_nobody(sdir, _plant_file(spool.PENDING, _forged("gpu778")))
    opened = spool.open_regular

    def protected_regular(path, flags=os.O_RDONLY, mode=0o600):
        if flags & os.O_CREAT and os.lstat(path).st_uid != os.geteuid():
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, flags, mode)
    monkeypatch.setattr(spool, "open_regular", protected_regular)
    _own_record(sdir)
    [batch] = [p for p in sdir.iterdir() if p.name.startswith("batch-")]
    assert [r["node"] for _, r, _ in spool.read_batch(batch)] == ["node01"]


@pytest.mark.parametrize("gone", ["set aside by the flush", "removed by its owner"])
def test_their_pending_jsonl_gone_between_the_refused_open_and_the_owner_look_costs_no_record(
        tmp_path, monkeypatch, gone):
    """Found by helper-130: after protected_regular's EACCES, append looked at the name's
    owner; their file set aside by a flush (or removed by them) meanwhile, it found nothing
    there, took the EACCES for its own and raised it: the append's records were lost. The
    name is free then: the append opens it again."""
    _, sdir = _sticky_spool(tmp_path)
    forged = _forged("gpu778")
    _as_nobody(sdir, _plant_file(spool.PENDING, forged))
    opened = spool.open_regular
    aside = sdir / f"{spool.PENDING}.not-ours-1"

    def protected_regular(path, flags=os.O_RDONLY, mode=0o600):
        if flags & os.O_CREAT and os.path.lexists(path) \
                and os.lstat(path).st_uid != os.geteuid():
            if gone == "removed by its owner":
                os.unlink(path)
            else:
                os.rename(path, aside)
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, flags, mode)
    monkeypatch.setattr(spool, "open_regular", protected_regular)
    _own_record(sdir)
    pending = sdir / spool.PENDING
    assert pending.lstat().st_uid == os.geteuid()
    assert [r["node"] for _, r, _ in spool.read_batch(pending)] == ["node01"]
    assert not [p for p in sdir.iterdir() if p.name.startswith("batch-")]
    if gone == "set aside by the flush":
        assert aside.read_bytes() == forged  # theirs untouched


def test_a_create_the_disk_refuses_is_said_at_once_not_opened_again(tmp_path, monkeypatch):
    """The open again is for a name something stood at: ENOSPC with nothing there is the
    append's error, said after one try."""
    sdir = tmp_path / "spool"
    sdir.mkdir()
    calls = []

    def full(path, flags=os.O_RDONLY, mode=0o600):
        calls.append(path)
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(spool, "open_regular", full)
    with pytest.raises(OSError) as raised:
        _own_record(sdir)
    assert raised.value.errno == 28 and len(calls) == 1


def test_a_pending_jsonl_another_user_holds_locked_does_not_hang_the_append(tmp_path):
    """The lock was taken before the owner was looked at: a user who made pending.jsonl and
    held its flock kept every prolog waiting on it until Slurm's PrologTimeout."""
    import threading

    _, sdir = _sticky_spool(tmp_path)
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    dfd = os.open(sdir, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fd = os.open(spool.PENDING, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(ready_w, b"x")
            os.read(hold_r, 1)
        finally:
            os._exit(0)
    os.close(dfd)
    try:
        assert os.read(ready_r, 1) == b"x"
        errors: list[BaseException] = []

        def append() -> None:
            try:
                _own_record(sdir)
            except BaseException as exc:  # noqa: BLE001 - said by the assert below
                errors.append(exc)
        t = threading.Thread(target=append, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "append waited on another user's lock"
        assert errors == []
    finally:
        os.write(hold_w, b"x")
        os.waitpid(pid, 0)
    [batch] = [p for p in sdir.iterdir() if p.name.startswith("batch-")]
    assert [r["node"] for _, r, _ in spool.read_batch(batch)] == ["node01"]
