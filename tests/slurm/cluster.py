"""A real Slurm cluster on one machine, for tests: munged, slurmdbd (MariaDB), one slurmctld and
N `slurmd -N nodeNN`, everything (config, state, logs, spool, pid files) under one directory.

Plain module (no pytest) so other test areas can reuse it, e.g. for real `sacct` output:

    with SlurmCluster(tmp_path, nodes=6) as cluster:
        job = cluster.sbatch("-N", "2", "--wrap", "sleep 1")
        cluster.wait_for(lambda: cluster.job_state(job) == "COMPLETED", 60)

Lessons baked in (Debian slurm-wlm 22.05): each slurmd needs its own Port=; proctrack/linuxproc
and task/none need no cgroups; GPUs are declared without hardware through gres.conf File= on
`mknod c 1 3` devices; `AuthInfo=cred_expire` also sets how long a requeued job waits before
it is eligible again (default 120 s, 10 s here); `nohold_on_prolog_fail` lets a job whose
prolog failed run elsewhere instead of waiting held.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fixtures.nodes.node_copy import copy_node
from tests.ports import free_port as _free_port

SBIN = Path("/usr/sbin")


def slurm_available() -> bool:
    return shutil.which("slurmctld") is not None or (SBIN / "slurmctld").exists()


def _bin(name: str) -> str:
    return shutil.which(name) or str(SBIN / name)


def parse_kv_line(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output: Key=Value pairs separated by spaces (values may not be)."""
    out: dict[str, str] = {}
    key = None
    for token in line.split(" "):
        if "=" in token and token.split("=", 1)[0].replace("/", "").isalnum():
            key, value = token.split("=", 1)
            out[key] = value
        elif key is not None and token:
            out[key] += " " + token
    return out


def _stop_together(procs: list[subprocess.Popen], timeout: float) -> None:
    """SIGTERM to each that still runs, then one shared deadline for all of them; whichever is
    still there then is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class SlurmCluster:
    def __init__(
        self,
        base: Path,
        *,
        nodes: int = 6,
        gpus: int = 8,
        accounting: bool = True,
        prolog: Path | None = None,
        epilog: Path | None = None,
        extra_conf: str = "",
        node_conf: str = "",
    ):
        self.base = Path(base)
        self.node_names = [f"node{i:02d}" for i in range(1, nodes + 1)]
        self.gpus = gpus
        self.accounting = accounting and shutil.which("mariadb") is not None
        self.prolog = prolog
        self.epilog = epilog
        self.extra_conf = extra_conf
        self.node_conf = node_conf  # more words on every NodeName line (Features=...)
        self.cluster_name = "rsch" + secrets.token_hex(3)
        self.db_name = f"slurm_acct_{self.cluster_name}"
        self._dropped = False  # the accounting database: stop() drops it once
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.base / "etc" / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.ctld_port = _free_port()
        self.dbd_port = _free_port()
        self.node_ports = {n: _free_port() for n in self.node_names}

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        # Daemons run in their own sessions: make sure an interrupted run does not leave them.
        atexit.register(self.stop)
        for sub in ("etc", "state", "log", "run", "spool", "munge", "dev"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        if self.accounting:
            self._start_dbd()
        self.start_slurmctld(clean=True)
        for node in self.node_names:
            self.start_slurmd(node)
        # slurmd registration under a loaded CI (four xdist workers starting clusters at once)
        # took past 60 s once (test_real_accounting's set-up); the wait ends as soon as they are.
        self.wait_for(self._all_nodes_idle, 180, "all nodes IDLE")

    def stop(self, timeout: float = 15) -> None:
        """Every daemon asked to stop at once and waited for together (one by one, each up to
        15 s, the end of a loaded run took a minute here); the accounting database dropped
        without waiting for it (a new cluster makes a database of a new name). Twice is
        harmless: atexit calls it again."""
        _stop_together([self.procs.pop(name) for name in list(self.procs)[::-1]], timeout)
        if self.accounting and not self._dropped:
            self._dropped = True
            subprocess.Popen(  # noqa: S603 - our own test database, reaped by init
                ["mariadb", "-h", "127.0.0.1", "-u", "root", "-e",
                 f"DROP DATABASE IF EXISTS `{self.db_name}`"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / "log" / f"{name}.out", "ab")  # noqa: SIM115 - owned by Popen
        self.procs[name] = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _stop_proc(self, name: str, sig_timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            _stop_together([proc], sig_timeout)

    def _start_munge(self) -> None:
        key = self.base / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        mdir = self.base / "munge"
        mdir.chmod(0o700)
        self._spawn("munged", [
            _bin("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={mdir / 'munged.pid'}",
            f"--log-file={mdir / 'munged.log'}", f"--seed-file={mdir / 'munged.seed'}",
        ])
        self.wait_for(self.munge_socket.exists, 20, "munged socket")

    def _write_conf(self) -> None:
        b = self.base
        devs = []
        for i in range(self.gpus):
            dev = b / "dev" / f"nvidia{i}"
            if not dev.exists():
                try:
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
                except OSError:
                    break
            devs.append(dev)
        gres = len(devs) == self.gpus and self.gpus > 0
        gres_spec = f" Gres=gpu:{self.gpus}" if gres else ""
        more = f" {self.node_conf}" if self.node_conf else ""
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=2 "
            f"RealMemory=1000{gres_spec} State=UNKNOWN{more}"
            for n, p in self.node_ports.items()
        )
        acct = (
            f"AccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=localhost\nAccountingStoragePort={self.dbd_port}\n"
            f"AccountingStorageTRES=gres/gpu\n"
            # the slurmdbd connection authenticates through this socket, not AuthInfo's
            f"AccountingStoragePass={self.munge_socket}\n"
            if self.accounting
            else "AccountingStorageType=accounting_storage/none\n"
        )
        hooks = ""
        if self.prolog:
            hooks += f"Prolog={self.prolog}\n"
        if self.epilog:
            hooks += f"Epilog={self.epilog}\n"
        auth = f"socket={self.munge_socket},cred_expire=10"
        self.conf.write_text(
            f"""ClusterName={self.cluster_name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo={auth}
CredType=cred/munge
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=nohold_on_prolog_fail,sched_interval=2,bf_interval=2
ReturnToService=2
# `scontrol reboot` is refused without one; tests cancel any reboot before it is issued.
RebootProgram=/bin/true
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
MinJobAge=600
JobRequeue=1
KillWait=2
InactiveLimit=0
MpiDefault=none
LaunchParameters=enable_nss_slurm
GresTypes=gpu
{acct}{hooks}{self.extra_conf}
{nodes}
PartitionName=gpu Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP
"""
        )
        if gres:
            (b / "etc" / "gres.conf").write_text(
                "AutoDetect=off\n"
                + "".join(
                    f"NodeName={n} Name=gpu File={b}/dev/nvidia[0-{self.gpus - 1}]\n"
                    for n in self.node_names
                )
            )

    def _start_dbd(self) -> None:
        b = self.base
        subprocess.run(
            ["mariadb", "-h", "127.0.0.1", "-u", "root", "-e",
             f"CREATE DATABASE IF NOT EXISTS `{self.db_name}`"],
            check=True, capture_output=True, timeout=30,
        )
        dbd = b / "etc" / "slurmdbd.conf"
        dbd.write_text(
            f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
PidFile={b}/run/slurmdbd.pid
LogFile={b}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=root
StorageLoc={self.db_name}
"""
        )
        dbd.chmod(0o600)
        self._spawn("slurmdbd", [_bin("slurmdbd"), "-D"])
        self.wait_for(lambda: self._port_open(self.dbd_port), 60, "slurmdbd listening")
        self.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name], timeout=30)

    def start_slurmctld(self, clean: bool = False) -> None:
        argv = [_bin("slurmctld"), "-D", "-i"] + (["-c"] if clean else [])
        self._spawn("slurmctld", argv)
        self.wait_for(lambda: self._port_open(self.ctld_port), 60, "slurmctld listening")
        self.wait_for(lambda: self.run(["scontrol", "ping"], check=False).returncode == 0,
                      30, "scontrol ping")

    def stop_slurmctld(self) -> None:
        self._stop_proc("slurmctld")
        self.wait_for(lambda: not self._port_open(self.ctld_port), 30, "slurmctld stopped")

    def start_slurmd(self, node: str) -> None:
        (self.base / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd-{node}", [_bin("slurmd"), "-D", "-N", node])

    def reboot_slurmd(self, node: str) -> None:
        """A reboot Slurm issued (RebootProgram is /bin/true), as slurmctld sees it done:
        slurmd stops and registers again with a boot time after the request. Its uptime is
        read in a time namespace whose boot clock starts now (unshare --boottime), and the
        node's root gets a new kernel boot id (random(4)), as a rebooted kernel has."""
        self._stop_proc(f"slurmd-{node}")
        (self.root(node) / "proc/sys/kernel/random/boot_id").write_text(f"{uuid.uuid4()}\n")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        (self.base / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd-{node}", [
            "unshare", "--time", f"--boottime={-int(uptime)}", "--kill-child=SIGTERM",
            _bin("slurmd"), "-D", "-N", node])

    @staticmethod
    def _port_open(port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    # ---- helpers for tests -----------------------------------------------------------------
    def run(
        self, argv: list[str], *, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{argv} -> {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str) -> str:
        out = self.run(["sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", *args])
        return out.stdout.strip().split(";")[0]

    def wait_for(
        self, predicate: Callable[[], Any], timeout: float, what: str = "", interval: float = 0.5
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
            time.sleep(interval)

    def node(self, name: str) -> dict[str, str]:
        return parse_kv_line(self.run(["scontrol", "-o", "show", "node", name]).stdout.strip())

    def node_state(self, name: str) -> str:
        return self.node(name).get("State", "")

    def job(self, job_id: str) -> dict[str, str]:
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout.strip()
        return parse_kv_line(out.splitlines()[0]) if out else {}

    def job_state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def sacct(self, job_id: str, fields: str = "JobIDRaw,State,NodeList") -> list[list[str]]:
        out = self.run(["sacct", "-X", "-D", "-n", "--parsable2", "-j", job_id,
                        f"--format={fields}"]).stdout
        return [line.split("|") for line in out.splitlines() if line]

    def _all_nodes_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return all(states.get(n) == "idle" for n in self.node_names)

    def reset(self) -> None:
        """Between tests: no jobs, every node back to IDLE with no reason, slurmd all up."""
        t0 = time.monotonic()
        jobs = self.run(["squeue", "-h", "-o", "%i"]).stdout.split()
        if jobs:
            self.run(["scancel", *jobs], check=False)
        for node in self.node_names:
            proc = self.procs.get(f"slurmd-{node}")
            if proc is None or proc.poll() is not None:
                self.start_slurmd(node)
        self.wait_for(lambda: not self.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")
        t_queue = time.monotonic() - t0
        for node in self.node_names:
            state = self.node_state(node)
            if "DRAIN" in state or "DOWN" in state:
                self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                         check=False)
        self.wait_for(self._all_nodes_idle, 60, "all nodes IDLE after reset")
        with open(self.base / "log" / "reset.log", "a") as fh:
            fh.write(f"queue empty {t_queue:.1f}s, idle {time.monotonic() - t0:.1f}s\n")


# ---- rsc-health on the cluster --------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
HEALTHY = REPO / "tests" / "fixtures" / "nodes" / "healthy"

# Site settings every test node reads on top of its fixture's own config.toml.
SITE_CONFIG = """
[slurm]
call_timeout_s = 5
sweep_budget_s = 20
lock_timeout_s = 10

[actions]
resume_after_clean_sweeps = 2
guard_max_share = 0.34
guard_window_min = 15
guard_settle_s = 1.5
"""


class RscHealthCluster(SlurmCluster):
    """SlurmCluster wired to the project's real prolog, epilog and sweep; every node reads its
    own copy of the `healthy` fixture under base/roots/<node>, where tests inject faults."""

    def __init__(self, base: Path, **kw):
        base = Path(base)
        super().__init__(
            base, prolog=base / "hooks" / "prolog", epilog=base / "hooks" / "epilog",
            # slurmd runs the real sweep once at start-up (before registering) and then hourly;
            # tests run sweeps themselves (cluster.sweep) so that they happen when asserted.
            extra_conf=(
                "PrologFlags=Alloc\n"
                f"HealthCheckProgram={base / 'hooks' / 'sweep'}\n"
                "HealthCheckInterval=3600\nHealthCheckNodeState=ANY\n"
            ),
            **kw,
        )

    def start(self) -> None:
        self._write_hooks()
        for node in self.node_names:
            self.reset_root(node)
        super().start()

    def root(self, node: str) -> Path:
        return self.base / "roots" / node

    def reset_root(self, node: str) -> None:
        """Make the node's root a pristine `healthy` copy again: a full copy the first time,
        then only the files a test changed (copy2 keeps mtimes, so size+mtime tell) and the
        node-local state (spool, cursors, drain state) wiped."""
        root = self.root(node)
        if not root.exists():
            copy_node(root, HEALTHY)
        else:
            shutil.rmtree(root / "var" / "lib" / "rsc_health", ignore_errors=True)
            for src in HEALTHY.rglob("*"):
                if src.is_symlink() or not src.is_file():
                    continue
                dst = root / src.relative_to(HEALTHY)
                s, d = src.stat(), dst.stat() if dst.exists() else None
                if d is None or d.st_size != s.st_size or d.st_mtime_ns != s.st_mtime_ns:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
        site = (HEALTHY / "config.toml").read_text() + SITE_CONFIG
        (root / "site.toml").write_text(site)

    def node_env(self, node: str) -> dict[str, str]:
        return dict(
            self.env,
            SLURMD_NODENAME=node,
            RSC_HEALTH_ROOT=str(self.root(node)),
            RSC_HEALTH_CONFIG=str(self.root(node) / "site.toml"),
            RSC_HEALTH_PYTHON=_python(),
            PYTHONPATH=str(REPO),
        )

    def _write_hooks(self) -> None:
        hooks = self.base / "hooks"
        hooks.mkdir(parents=True, exist_ok=True)
        # slurmd runs prolog/epilog with a bare environment: this is the site's
        # /etc/default/rsc-health, per node because every node here has its own root.
        for name, target in (("prolog", "prolog/rsc-health-prolog"),
                             ("epilog", "epilog/rsc-health-epilog"),
                             ("sweep", "checks/rsc-health-sweep")):
            script = hooks / name
            script.write_text(
                "#!/bin/sh\n"
                f"export SLURM_CONF={self.conf}\n"
                f"export RSC_HEALTH_ROOT={self.base}/roots/$SLURMD_NODENAME\n"
                f"export RSC_HEALTH_CONFIG={self.base}/roots/$SLURMD_NODENAME/site.toml\n"
                f"export RSC_HEALTH_PYTHON={_python()} PYTHONPATH={REPO}\n"
                f"exec {REPO / target} >>{self.base}/log/{name}-$SLURMD_NODENAME.log 2>&1\n"
            )
            script.chmod(0o755)

    def sweep(self, node: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """One periodic sweep on `node`, exactly as HealthCheckProgram / the timer runs it."""
        return subprocess.run(
            [str(REPO / "checks" / "rsc-health-sweep")], env=self.node_env(node),
            capture_output=True, text=True, timeout=timeout,
        )

    def spool(self, node: str) -> list[dict]:
        import json

        path = self.root(node) / "var/lib/rsc_health/spool/pending.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def reset(self) -> None:
        super().reset()
        for node in self.node_names:
            self.reset_root(node)


def _python() -> str:
    import sys

    return sys.executable
