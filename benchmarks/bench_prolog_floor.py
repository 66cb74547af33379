"""Where the healthy prolog's instructions go, and what a job-start fast path that imports
nothing heavy would cost: the measurement behind issue 25's "healthy prolog <= 2.5x a bare
interpreter start".

    python3 benchmarks/bench_prolog_floor.py [--venv DIR] [--runs 10]

Same node install, clean environment, fixture node and "bare" as benchmarks/bench_prolog.py
(`python -c pass` of the node install's own interpreter; nothing here redefines it). Three parts:

1. Breakdown (callgrind instructions, a figure load does not move): the interpreter importing,
   one layer more each time, the modules a healthy prolog ends up holding (its sys.modules at
   the end of a second job start: the first parses the TOML), then the prolog itself:
       bare -> + json (enum, re, functools, collections...) -> + pathlib (urllib.parse,
       ipaddress, fnmatch...) -> + every other stdlib module it holds -> + every rsc_health
       module it holds -> the whole prolog (the run itself).
2. A cost model of the fast path the issue's conclusion asks for, NOT the product: a script
   that imports only os, marshal, fcntl, select and time and does the I/O a healthy job start
   on this node must do: stat the site config and the code (the compiled config's key), load
   the compiled config (marshal), flock the node lock, read every input the prolog's families
   read here (the IB ports' sysfs files, /proc/mounts, the boot id, the kernel log, the NVML
   replay file, the node state files) and compare them with what the last full run saw (a
   marshal memo), statvfs the expected mounts and read the NVML answers each in a forked
   child that sends them back marshalled (the replay file's JSON is parsed there; a live
   node's child runs pynvml) and that the parent waits for with select() and a deadline (a
   hung mount or a wedged driver cannot hold it), then append the same nine records a
   healthy prolog spools (seven all-clear rows, job_start, heartbeat), JSON encoded by hand,
   flock'd and fsync'd (checked: the same kinds of record with the same fields as the
   prolog's). It judges nothing: it bounds from below what any fast path of that shape costs,
   so the gap between it and 2.5x is what judging may spend. Its costliest process is the
   NVML child: callgrind counts a forked child from its parent's count at the fork, and that
   child imports json to parse the replay file (bench_prolog's figure, the costliest process,
   is kept; each process's count is printed too).

3. What a live node's NVML child imports on top (the fixture replays NVML from a file, so no
   benchmark here runs it): `import pynvml` and, for a binding of our own, `import ctypes`.

Interleaved wall and CPU medians of bare, the prolog and the model are printed beside the
instructions. The model's first run (uncounted, untimed) writes its memo, as the real prolog's
first run writes the compiled config.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_prolog import BARE, clean_env, node_install, timed_cpu  # noqa: E402

from rsc_health.node import JOB_START_GC_THRESHOLD  # noqa: E402
from rsc_health.node.start import JOB_START_CODE  # noqa: E402
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node  # noqa: E402

# The fast path's cost model (see the module docstring). argv: prolog; env as the prolog's.
MODEL = r'''
import os, marshal, fcntl, select, time
t0 = time.monotonic()
root = os.environ["RSC_HEALTH_ROOT"]
site = os.environ["RSC_HEALTH_CONFIG"]
sdir = root + "/var/lib/rsc_health"
def skey(p):
    try:
        st = os.stat(p)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)
here = os.path.dirname(os.__file__)
code = ("os.py", "stat.py", "posixpath.py", "genericpath.py", "_collections_abc.py")
key = (skey(site), tuple(skey(os.path.join(here, n)) for n in code))
def read(p, limit=1 << 20):
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)
cfg = marshal.loads(read(sdir + "/compiled_config.marshal"))
lock = os.open(sdir + "/node.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
ib = root + "/sys/class/infiniband"
inputs = [root + p for p in ("/proc/mounts", "/proc/sys/kernel/random/boot_id",
                              "/dev/kmsg")]
inputs += [sdir + "/" + n for n in ("xid_cursor.json", "counters.json")]
for hca in sorted(os.listdir(ib)):
    for port in sorted(os.listdir(ib + "/" + hca + "/ports")):
        d = ib + "/" + hca + "/ports/" + port
        inputs += [d + "/" + a for a in ("state", "phys_state", "rate", "link_layer")]
        inputs += [d + "/counters/" + c for c in sorted(os.listdir(d + "/counters"))]
seen = {}
for p in inputs:
    try:
        seen[p] = read(p)
    except OSError as exc:
        seen[p] = exc.errno
seq = -1
for line in seen[root + "/dev/kmsg"].split(b"\n"):
    head = line.split(b";", 1)[0].split(b",")
    if len(head) > 2 and head[1].isdigit():
        seq = max(seq, int(head[1]))
def start(fn):
    """A forked child that sends fn()'s answer back marshalled: (pid, read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            data = marshal.dumps(fn())
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    return pid, r
def wait_for(child, deadline):
    """Its answer, or None past the deadline (time.monotonic()); a late child is left."""
    pid, r = child
    buf = b""
    while True:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(r, 1 << 16) if ready else b""
        if not chunk:
            break
        buf += chunk
    os.close(r)
    os.waitpid(pid, 0 if ready else os.WNOHANG)
    return marshal.loads(buf) if ready else None
def probe():
    for m in (root + "/", root + "/home", root + "/checkpoint"):
        os.statvfs(m)
    return "ok"
def nvml():  # the replay backend's file; a live node's child runs pynvml instead
    import json
    with open(root + "/rsc_health/nvml.json", "rb") as fh:
        return json.loads(fh.read())
probing, reading = start(probe), start(nvml)  # both at once: neither waits for the other
answer = wait_for(probing, time.monotonic() + 2.0)
gpus = wait_for(reading, time.monotonic() + 10.0)
memo = sdir + "/model_memo.marshal"
now = (key, seen, seq, answer, gpus)
try:
    same = marshal.loads(read(memo)) == now
except OSError:
    same = None
    with open(memo, "wb") as fh:
        fh.write(marshal.dumps(now))
if same is False:
    raise SystemExit("model: inputs differ from its memo")
def q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
node = os.environ.get("SLURMD_NODENAME", "")
job = os.environ.get("SLURM_JOB_ID", "")
g = time.gmtime()
when = q(time.strftime("%Y-%m-%dT%H:%M:%S", g) + ".%06d+00:00" % int(time.time() % 1 * 1e6))
common = ',"node":' + q(node) + ',"time":' + when
fams = ("ecc", "gpu", "infiniband", "leftover", "mount", "remap", "xid")
def rid():
    return q(os.urandom(16).hex())
lines = ['{"check":' + q(f) + ',"code":"","component":"*","id":' + rid() + ',"job_id":'
         + q(job) + ',"kind":"check"' + common + ',"reason":"all clear","severity":"none",'
         '"source":"prolog","status":"ok"}' for f in fams]
lines.append('{"excluded":[],"id":' + rid() + ',"job_id":' + q(job) + ',"kind":"job_start"'
             + common + ',"partition":' + q(os.environ.get("SLURM_JOB_PARTITION", ""))
             + ',"user":' + q(os.environ.get("SLURM_JOB_USER", "")) + '}')
lines.append('{"checker_errors":0,"duration_s":' + "%.3f" % (time.monotonic() - t0)
             + ',"families":{' + ",".join(q(f) + ':"ok"' for f in fams) + '},"id":' + rid()
             + ',"gpus":{' + ",".join(q(str(d["index"])) + ":" + q(d["pci_bus_id"])
                                     for d in gpus["devices"]) + "}"
             + ',"kind":"heartbeat","level":"ok"' + common
             + ',"source":"prolog","version":"0.1.0","versions":{"driver":'
             + q(gpus["driver_version"]) + "}}")
flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
fd = os.open(sdir + "/spool/pending.jsonl", flags, 0o640)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, ("\n".join(lines) + "\n").encode())
os.fsync(fd)
os.close(fd)
os._exit(0)
'''


def callgrind(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """Instructions of the costliest process of argv (bench_prolog's figure)."""
    return max(callgrind_each(argv, env, cwd))


def callgrind_each(argv: list[str], env: dict[str, str], cwd: str) -> list[int]:
    """Instructions of each process of argv: the first process's, then its children's, most
    first. A forked child's count starts from its parent's at the fork (callgrind copies its
    counters with the process), so the counts do not add up: a child's minus its
    parent's-at-the-fork is its own work."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    lines = out.stderr.splitlines()
    counts = {ln.split("==")[1]: int(ln.split()[-1]) for ln in lines if "Collected :" in ln}
    said = [ln for ln in lines if not ln.startswith("==")]
    if out.returncode != 0 or said or not counts or not lines:
        raise SystemExit(f"{argv[:3]} under valgrind: rc {out.returncode}: {said[-5:]}")
    first = lines[0].split("==")[1]  # valgrind's banner comes from the process it started
    return [counts.pop(first), *sorted(counts.values(), reverse=True)]


def held_modules(python: str, env: dict[str, str], cwd: str) -> list[str]:
    """Every module a healthy prolog holds at its end beyond a bare start, in the order they
    were first imported (sys.modules keeps it). -X importtime misses some: the prolog leaves
    by os._exit."""
    show = "import sys; print(' '.join(sys.modules), file=sys.stderr)"
    def held(code: str, *argv: str) -> list[str]:
        out = subprocess.run([python, "-c", code, *argv], env=env, cwd=cwd,
                             capture_output=True, text=True, check=True)
        return out.stderr.split("\n")[-2].split()

    bare = set(held(show))
    # job_start() leaves by os._exit: main() is what it runs, after the same GC threshold.
    run = (f"import gc, sys; gc.set_threshold({JOB_START_GC_THRESHOLD}); "
           "import rsc_health.node.start; from rsc_health.nodepath import main; "
           "main(sys.argv[1:]); " + show.replace("import sys; ", ""))
    return [m for m in held(run, "prolog") if m not in bare and not m.startswith("__main__")]


def same_shape(prolog_root: Path, model_root: Path) -> None:
    """The model spools what the prolog spools: the last nine records of each are JSON of the
    same kinds with the same fields (ids, times and durations differ)."""
    def last(root: Path) -> list[tuple[str, tuple[str, ...]]]:
        lines = (root / NODE_STATE / "spool" / "pending.jsonl").read_text().splitlines()[-9:]
        return sorted((r["kind"], tuple(sorted(r))) for r in map(json.loads, lines))

    if last(prolog_root) != last(model_root):
        raise SystemExit(f"the model's records differ from the prolog's:\n"
                         f"{last(prolog_root)}\n{last(model_root)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, help="keep the node install here (bench_prolog's)")
    ap.add_argument("--runs", type=int, default=10, help="interleaved wall runs per case")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        print("skipped: needs valgrind (callgrind), as bench_prolog.py --instructions does")
        return
    with tempfile.TemporaryDirectory() as tmp:
        python = str(node_install(args.venv or Path(tmp) / "venv"))

        def fresh(name: str) -> dict[str, str]:
            root = copy_node(Path(tmp) / name)
            return clean_env(RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "config.toml"),
                             SLURMD_NODENAME="bench01", SLURM_JOB_ID="4244",
                             SLURM_JOB_NODELIST="bench[01-04]")

        prolog = [python, "-c", JOB_START_CODE, "prolog"]
        env = fresh("node")
        timed_cpu(prolog, env, tmp)  # the node's first job start: compiles the config
        mods = held_modules(python, env, tmp)
        ours = [m for m in mods if m == "rsc_health" or m.startswith("rsc_health.")]
        stdlib = [m for m in mods if m not in ours]
        heavy = ["json"], ["pathlib"]
        layers = [("bare", []), ("+ json (enum, re, ...)", heavy[0]),
                  ("+ pathlib", heavy[0] + heavy[1]),
                  (f"+ the other {len(stdlib)} stdlib modules", stdlib),
                  (f"+ the {len(ours)} rsc_health modules", stdlib + ours)]
        counts: list[tuple[str, int]] = []
        for label, imports in layers:
            # The job start's GC threshold first, as node.start sets it before its imports.
            code = "pass" if not imports else (f"import gc; gc.set_threshold("
                                               f"{JOB_START_GC_THRESHOLD}); import "
                                               + ", ".join(imports))
            counts.append((label, callgrind([python, "-c", code], env, tmp)))
        counts.append(("the whole healthy prolog (+ the run)", callgrind(prolog, env, tmp)))
        # What a live node's NVML child adds (the fixture replays NVML from a file, so neither
        # benchmark runs it): collect.gpu.NvmlBackend imports pynvml in the forked child.
        nvml_imports = {name: callgrind([python, "-c", f"import {name}"], env, tmp)
                        for name in ("pynvml", "ctypes")}
        model_env = fresh("model")
        timed_cpu(prolog, model_env, tmp)  # compiled config, as the prolog's second run has it
        model = [python, "-c", MODEL, "prolog"]
        timed_cpu(model, model_env, tmp)  # writes the model's memo
        each = {"prolog": callgrind_each(prolog, env, tmp),
                "model": callgrind_each(model, model_env, tmp)}
        model_ir = max(each["model"])
        wall: dict[str, list[float]] = {"bare": [], "prolog": [], "model": []}
        cpu: dict[str, list[float]] = {"bare": [], "prolog": [], "model": []}
        cases = {"bare": ([python, "-c", BARE], env), "prolog": (prolog, env),
                 "model": (model, model_env)}
        same_shape(Path(env["RSC_HEALTH_ROOT"]), Path(model_env["RSC_HEALTH_ROOT"]))
        for _ in range(args.runs):
            for name, (argv, e) in cases.items():
                w, c = timed_cpu(argv, e, tmp)
                wall[name].append(w)
                cpu[name].append(c)
    bare = counts[0][1]
    previous = 0
    print("instructions (callgrind Ir), cumulative layers:")
    for label, n in counts:
        print(f"  {label:42s} {n / 1e6:7.1f} M  ({n / bare:.2f}x bare, "
              f"+{(n - previous) / 1e6 if previous else 0:.1f} M)")
        previous = n
    print(f"  {'fast-path cost model':42s} {model_ir / 1e6:7.1f} M  ({model_ir / bare:.2f}x bare)")
    for name, per in each.items():
        print(f"  {name + ', parent then children (from the fork)':42s} "
              + ", ".join(f"{n / 1e6:.1f}" for n in per) + " M")
    for name, n in nvml_imports.items():
        print(f"  {'import ' + name + ' alone':42s} {n / 1e6:7.1f} M  (+{(n - bare) / 1e6:.1f} M"
              f" over bare{': a live node NVML child pays it' if name == 'pynvml' else ''})")
    print(f"  2.5x bare = {2.5 * bare / 1e6:.1f} M: room left for judging over the model: "
          f"{(2.5 * bare - model_ir) / 1e6:.1f} M")
    for name in wall:
        print(f"  {name:7s} wall median {statistics.median(wall[name]) * 1000:6.1f} ms, "
              f"cpu median {statistics.median(cpu[name]) * 1000:6.1f} ms")
    print(f"({args.runs} runs each, interleaved; load average {os.getloadavg()[0]:.2f})")
    print(f"stdlib modules held: {' '.join(stdlib)}")
    print(f"rsc_health modules held: {' '.join(ours)}")
    for label, n in counts:
        print(f"BENCH\tprolog_floor\t{label}\t{n / 1e6:.1f}\tM instructions")
    print(f"BENCH\tprolog_floor\tfast-path model\t{model_ir / 1e6:.1f}\tM instructions")
    for name, n in nvml_imports.items():
        print(f"BENCH\tprolog_floor\timport {name} over bare\t{(n - bare) / 1e6:.1f}\t"
              "M instructions")
    print(f"BENCH\tprolog_floor\tfast-path model / bare\t{model_ir / bare:.2f}\tx")
    print(f"BENCH\tprolog_floor\tfast-path model parent / bare\t"
          f"{each['model'][0] / bare:.2f}\tx")


if __name__ == "__main__":
    main()
