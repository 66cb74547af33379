"""DCGM's own verdicts taken in as findings, where DCGM is installed and the site asks for it:
`dcgmi health -g GROUP -c -j` (the health watches' incidents: each entity's systems, e.g.
"Memory system", Failure / Warning with DCGM's message) and, with `[dcgm] diag_level` > 0,
`dcgmi diag -r N -j` (read by the one reader of that JSON, rsc_health.qualify.dcgm_diag).

A DCGM Failure (health) or Fail (diag) drains after the job; a Warning / Warn warns. What says
nothing of the node is the checker's: dcgmi missing, refused (others could write it), killed at
`[dcgm] timeout_s`, output that is not DCGM's JSON (e.g. "Error: Health watches not enabled",
or nv-hostengine not running), a diag runtime error, or a diag failure whose warning says the
test could not run (allocation, GPU busy: qualify.dcgm_diag.NOT_TESTED).

Off by default (`[dcgm] enabled`): nothing is spawned. `[dcgm] health_file` / `diag_file`
judge saved outputs instead of running dcgmi (an output taken elsewhere, e.g.
`dcgmi diag -r 3 -j > diag.json` during a maintenance window, then
`healthctl check --only dcgm` with the file named). The programs' JSON is JSON-parsed here
only at judging time, bounded in size; the record is plain text a snapshot carries.

dcgmi asks nv-hostengine, at `[dcgm] host` (`--host`): a TCP port or, `unix://PATH`, the socket
of an nv-hostengine started with `-d PATH`. Whoever answers there gives the verdict, and with
nv-hostengine down any local user may listen on its port and answer "Healthy". So dcgmi is
asked only where root answers (host_refusal): a port of this node (the host as the C library
resolves it, as dcgmi does: "localhost", "127.1", "0", its own name or interface address) whose
every listener that answers there is root's (/proc/net/tcp, tcp6), a socket root owns on a path
only root can change; another machine's address is taken as the operator set it.
"""

from __future__ import annotations

import os
import stat

from rsc_health.checks import _program
from rsc_health.checks._finding import checker_error, fail, ok, warn
from rsc_health.checks.env import replayed
from rsc_health.collect.sysfs import ours, pure, read_bounded
from rsc_health.compat import json_loads
from rsc_health.model import Finding, Severity

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

FAMILY = "dcgm"
MAX_OUTPUT = 4 * 2**20  # a diag of 8 GPUs and switches prints tens of kB
HEALTHY, WARNING, FAILURE = "Healthy", "Warning", "Failure"
OVERALL = "Overall Health"
HOSTENGINE_PORT = 5555  # nv-hostengine's default (-p), dcgmi's when --host names none
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
TCP_TABLE_BYTES = 16 * 2**20  # /proc/net/tcp: ~150 bytes a socket, listeners first


def collect(root: StrPath, env) -> dict:
    doc = replayed(root, env.cfg, "dcgm", "dcgmi")
    return doc if doc is not None else record(root, env.cfg, env.deadline)


def capture(cfg, root: StrPath, env) -> dict:
    return {"dcgm_record": record(root, cfg, None)}


def _saved(root: StrPath, rel: str) -> dict:
    """A saved output, as a run record would hold it. It stands for dcgmi's own answer and is
    held to dcgmi's rule (durable.trust_refusal): a file another user could write (or a
    directory on its path) is refused, or a forged "Healthy" would keep a failing node in
    service and a forged "Failure" drain a good one."""
    from rsc_health.durable import trust_refusal

    path = pure(os.path.join(root, rel.lstrip("/")))
    try:
        why = trust_refusal(os.stat(path), path, rel)
        if why:
            return {"argv": [rel], "refused": why}
        text = read_bounded(path, MAX_OUTPUT).decode("utf-8", "replace")
    except OSError as exc:
        return {"argv": [rel], "refused": f"{rel}: {exc.strerror or exc}"}
    return {"argv": [rel], "returncode": 0, "stdout": text}


def record(root: StrPath, cfg, deadline: float | None) -> dict:
    doc: dict = {}
    health_file, diag_file = str(cfg.get("dcgm.health_file")), str(cfg.get("dcgm.diag_file"))
    if health_file:
        doc["health"] = _saved(root, health_file)
    if diag_file:
        doc["diag"] = _saved(root, diag_file)
    if not cfg.get("dcgm.enabled") or health_file or diag_file:
        return doc
    dcgmi, timeout = str(cfg.get("dcgm.dcgmi")), float(cfg.get("dcgm.timeout_s"))
    host = str(cfg.get("dcgm.host"))
    asks = []
    if cfg.get("dcgm.health"):
        asks.append(("health", ["health", "-g", str(cfg.get("dcgm.group")), "-c", "-j"]))
    diag_level = int(cfg.get("dcgm.diag_level"))
    if diag_level > 0:
        asks.append(("diag", ["diag", "-r", str(diag_level), "-j"]))
    why, witness = host_door(root, host) if asks else ("", None)
    for key, args in asks:
        args = [*args, "--host", host]
        if why:  # checked once, before either: whoever answers there is not nv-hostengine
            doc[key] = {"argv": [dcgmi, *args], "refused": why}
            continue
        doc[key] = _program.run(root, dcgmi, args, timeout_s=timeout, deadline=deadline,
                                max_bytes=MAX_OUTPUT)
        moved = host_moved(root, host, witness)
        if moved:
            doc[key]["untrusted"] = moved
    return doc


def host_refusal(root: StrPath, host: str) -> str:
    """Why dcgmi must not ask `host` ([dcgm] host), or "": an address dcgmi would take for
    something else; a unix socket that is not root's (or ours), or on a path someone else could
    change (durable.path_refusal); a name that does not resolve; a TCP port of this node (any
    address `host` resolves to that is loopback, the wildcard or an interface's) with no
    listener (nv-hostengine down: anyone may take the port while dcgmi starts) or one listener
    that is not root's (or ours). host_door also says who listens, for host_moved."""
    return host_door(root, host)[0]


def host_door(root: StrPath, host: str) -> tuple[str, frozenset | None]:
    """(host_refusal's why, the listeners that answer at `host`: {(uid, socket inode)} from
    /proc/net/tcp and tcp6, None where there are none to watch: a unix socket (a path only
    root can change), another machine)."""
    if not host or host.startswith("-") or not host.isprintable() or " " in host:
        return f"[dcgm] host {host[:80]!r} is not an address", None
    if host.startswith("unix://"):
        return _socket_refusal(root, host[len("unix://"):]), None
    name, port = _split_host(host)
    if port is None:
        return f"[dcgm] host {host[:80]!r}: the port is not a number", None
    local = _local_addresses(name)
    if isinstance(local, str):
        return f"[dcgm] host {host[:80]!r}: {local}", None
    if not local:
        return "", None  # another machine's nv-hostengine: trusted as the operator set it
    found = _answering(root, host, port, local)
    if isinstance(found, str):
        return found, None
    return _listener_refusal(host, found), found


def host_moved(root: StrPath, host: str, before: frozenset | None) -> str:
    """Why dcgmi's answer is not nv-hostengine's for certain although root alone listened at
    `host` when host_door looked (`before`), or "": the listeners there are not the same
    sockets now. A socket that is gone and back (nv-hostengine restarted), a new one, or none
    left: the port was free, or another's, while dcgmi ran, and whoever bound it first may have
    answered. While one root socket holds the port, no other user can bind it (the kernel
    refuses a second listener on a port and SO_REUSEPORT across users)."""
    if not before:
        return ""
    name, port = _split_host(host)
    local = _local_addresses(name)
    after = (_answering(root, host, port, local) if port is not None and local
             and not isinstance(local, str) else "")
    if after == before:
        return ""
    now = (after if isinstance(after, str) else
           ", ".join(f"uid {u} socket {i}" for u, i in sorted(after)) or "nothing")
    return (f"the listener at {host} changed while dcgmi ran (before: "
            + ", ".join(f"uid {u} socket {i}" for u, i in sorted(before))
            + f"; after: {now[:120]}): who answered is not known")


def _socket_refusal(root: StrPath, sock: str) -> str:
    from rsc_health.durable import path_refusal

    what = f"nv-hostengine socket unix://{sock}"
    if not sock.startswith("/"):
        return f"{what}: not an absolute path"
    path = pure(os.path.join(root, sock.lstrip("/")))
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{what}: {exc.strerror or exc} (nv-hostengine -d not running)"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{what}: not a socket"
    if not ours(st.st_uid):
        # Only root's nv-hostengine may answer; anyone may connect to it (its mode).
        return f"{what}: owned by uid {st.st_uid}, not root; refused"
    return path_refusal(path, what)


def _split_host(host: str) -> tuple[str, int | None]:
    """("127.0.0.1", 5555) from "127.0.0.1" or "127.0.0.1:5555"; "[::1]:5555" and "::1" too."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:
        name, port = host, ""
    if not port:
        return name, HOSTENGINE_PORT
    return name, int(port) if port.isdigit() and 0 < int(port) < 65536 else None


def _is_local(addr) -> bool:
    """An address that reaches this node: loopback, the wildcard (connect() to 0.0.0.0 or ::
    is a connection to this node), or one of its interfaces' (it can be bound)."""
    import socket

    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(addr), 0))  # EADDRNOTAVAIL: no interface of this node has it
    except OSError:
        return False
    return True


def _local_addresses(name: str):
    """The addresses of this node that dcgmi may reach at `name`, as the C library resolves it
    (dcgmi's own reading: "127.1", "0", "2130706433", "::ffff:127.0.0.1", this node's own
    name or address are all this node); () for another machine only; a str saying why when
    `name` does not resolve (dcgmi could not reach it either)."""
    import ipaddress
    import socket

    if name.rstrip(".").lower() in LOOPBACK_NAMES:  # "localhost." is localhost too
        # Not looked up: no DNS query for it (a resolver that is down would stall the run).
        return frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})
    found = set()
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return f"does not resolve ({exc}); not asked"
    for info in infos:
        try:
            addr = ipaddress.ip_address(str(info[4][0]).partition("%")[0])
        except ValueError:
            continue
        found.add(getattr(addr, "ipv4_mapped", None) or addr)
    return frozenset(a for a in found if _is_local(a))


def _listeners(text: str, port: int, targets: frozenset) -> list[tuple[int, int]]:
    """The (uid, socket inode) of the LISTEN sockets on `port` that answer a connection to one
    of `targets` (this node's addresses): bound to it, to the wildcard, or (for a loopback
    target) to a loopback address, from /proc/net/tcp or tcp6 ("0100007F:15B3 00000000:0000
    0A ... uid ... inode": addresses as the kernel's host-order words, port in hex; uid and
    inode the 8th and 10th fields)."""
    import ipaddress
    import struct

    loopback = any(t.is_loopback or t.is_unspecified for t in targets)
    uids = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":
            continue
        addr_hex, _, port_hex = fields[1].partition(":")
        try:
            if int(port_hex, 16) != port or len(addr_hex) not in (8, 32):
                continue
            raw = b"".join(struct.pack("=I", int(addr_hex[i:i + 8], 16))
                           for i in range(0, len(addr_hex), 8))
            addr = ipaddress.ip_address(raw)
            uid, inode = int(fields[7]), int(fields[9])
        except ValueError:
            continue
        mapped = getattr(addr, "ipv4_mapped", None)
        if mapped is not None:
            addr = mapped
        if addr.is_unspecified or addr in targets or (loopback and addr.is_loopback):
            uids.append((uid, inode))
    return uids


def _answering(root: StrPath, host: str, port: int, targets: frozenset
               ) -> frozenset | str:
    """{(uid, socket inode)} of the listeners that answer at `targets`:`port`, or why the
    tables cannot be read."""
    found: set = set()
    for table in ("tcp", "tcp6"):  # a dual-stack listener on :: answers 127.0.0.1 too
        try:
            text = read_bounded(os.path.join(root, "proc", "net", table), TCP_TABLE_BYTES)
        except FileNotFoundError:
            continue  # no IPv6 on this kernel
        except OSError as exc:
            return f"nv-hostengine at {host}: /proc/net/{table}: {exc.strerror or exc}"
        found.update(_listeners(text.decode("ascii", "replace"), port, targets))
    return frozenset(found)


def _listener_refusal(host: str, found: frozenset) -> str:
    if not found:
        return (f"nothing listens on {host} (nv-hostengine not running): any user could "
                "answer there; not asked")
    others = sorted({u for u, _ in found if not ours(u)})
    if others:
        return (f"{host} is answered by uid {others[0]}, not root: not nv-hostengine's "
                "verdict; refused")
    return ""


def check(state, cfg: dict) -> list[Finding]:
    rec = state.extra.get(FAMILY)
    if not isinstance(rec, dict):
        return []
    out: list[Finding] = []
    if "health" in rec:
        out.extend(_health(rec["health"]))
    if "diag" in rec:
        out.extend(_diag(rec["diag"]))
    if not rec:
        out.append(ok(FAMILY, "dcgm", "DCGM not asked ([dcgm] enabled = false)"))
    elif not [f for f in out if f.severity > Severity.NONE or f.family != FAMILY]:
        out.append(ok(FAMILY, "dcgm", "DCGM reports no incident"))
    return out


def _json(run: dict, what: str) -> tuple[dict | None, Finding | None]:
    why = _program.trouble(run, what)
    if why:
        return None, checker_error(FAMILY, "dcgmi", why)
    text = str(run.get("stdout") or "")
    try:
        doc = json_loads(text)
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested too deep
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or str(
            run.get("stderr") or "").strip()
        shown = "".join(c for c in first if c.isprintable())[:160] or "no output"
        return None, checker_error(FAMILY, "dcgmi", f"{what} printed no JSON (exit "
                                   f"{run.get('returncode')}): {shown}")
    if not isinstance(doc, dict):
        return None, checker_error(FAMILY, "dcgmi", f"{what} printed JSON that is not DCGM's")
    return doc, None


def _component(group: str, entity: str) -> str:
    group = "".join(c for c in group.lower() if c.isalnum() or c == "_")[:16]
    entity = "".join(c for c in entity if c.isalnum())[:16]
    return {"gpu": "gpu", "switch": "nvswitch"}.get(group, group or "entity") + entity


def _code(kind: str, name: str) -> str:
    slug = "".join(c if c.isalnum() else "_" for c in name.lower().replace(" system", ""))
    return f"dcgm_{kind}_{'_'.join(p for p in slug.split('_') if p)[:40] or 'unknown'}"


def _first(mapping, limit: int) -> list:
    """The first `limit` items of what should be a JSON object (none if it is not one)."""
    return list(mapping.items())[:limit] if isinstance(mapping, dict) else []


def _system_finding(comp: str, system, verdict) -> Finding | None:
    """DCGM's verdict on one health system of one entity; None when it is healthy (or not a
    verdict at all)."""
    if not isinstance(verdict, dict):
        return None
    value = verdict.get("value")
    parts = verdict.get("overflow")
    message = " ".join(str(p) for p in parts if isinstance(p, str)) if isinstance(
        parts, list) else ""
    message = "".join(c for c in message if c.isprintable())[:200]
    text = f"{comp} DCGM {system}: {value}" + (f": {message}" if message else "")
    code = _code("health", str(system))
    data = {"system": str(system)[:64], "dcgm": value, "message": message}
    if value == FAILURE:
        return fail(FAMILY, comp, Severity.DRAIN_AFTER_JOB, code, text, repair=False, **data)
    if value == WARNING:
        return warn(FAMILY, comp, code, text, **data)
    if value != HEALTHY:
        return checker_error(FAMILY, comp, f"{comp} DCGM {system}: {str(value)[:40]!r}")
    return None


def _health(run: dict) -> list[Finding]:
    """`dcgmi health -c -j` (dcgmi/Health.cpp through DcgmiOutputJson): {"header": ["Health
    Monitor Report"], "body": {"Overall Health": {"value": ...}, "<entity group>":
    {"children": {"<id>": {"value": ..., "children": {"Errors": {"children": {"<system>":
    {"value": ..., "overflow": [message parts]}}}}}}}}}."""
    doc, trouble = _json(run, "dcgmi health")
    if doc is None:
        return [trouble] if trouble else []
    raw = doc.get("body")
    body: dict = raw if isinstance(raw, dict) else {}
    overall = body.get(OVERALL)
    overall_value = overall.get("value") if isinstance(overall, dict) else None
    if overall_value not in (HEALTHY, WARNING, FAILURE):
        return [checker_error(FAMILY, "dcgmi", "dcgmi health: no overall health in its "
                              f"answer ({str(overall_value)[:40]!r})")]
    out: list[Finding] = []
    for group, node in list(body.items())[:64]:
        if group == OVERALL or not isinstance(node, dict):
            continue
        for ident, entity in _first(node.get("children"), 1024):
            errors = (entity.get("children") or {}).get("Errors") if isinstance(
                entity, dict) else None
            systems = errors.get("children") if isinstance(errors, dict) else None
            comp = _component(str(group), str(ident))
            out.extend(f for f in (_system_finding(comp, system, verdict)
                                   for system, verdict in _first(systems, 64)) if f)
    if overall_value != HEALTHY and not out:
        # DCGM said so overall without naming an entity: still its verdict.
        text = f"DCGM overall health: {overall_value}"
        if overall_value == FAILURE:
            out.append(fail(FAMILY, "dcgm", Severity.DRAIN_AFTER_JOB, "dcgm_health", text,
                            repair=False))
        else:
            out.append(warn(FAMILY, "dcgm", "dcgm_health", text))
    return out


def _diag(run: dict) -> list[Finding]:
    from rsc_health.qualify.dcgm_diag import (
        DCGM_FAIL,
        DCGM_WARN,
        diagnostic,
        results,
        unplaced_fails,
    )

    doc, trouble = _json(run, "dcgmi diag")
    if doc is None:
        return [trouble] if trouble else []
    try:
        diag = diagnostic(doc)
        found = results(doc)
        unplaced = unplaced_fails(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return [checker_error(FAMILY, "dcgmi", f"dcgmi diag: not DCGM's diagnostic JSON "
                              f"({type(exc).__name__}: {str(exc)[:80]})")]
    if diag.get("runtime_error"):
        return [checker_error(FAMILY, "dcgmi", "dcgmi diag runtime error: "
                              f"{str(diag['runtime_error'])[:160]}")]
    out: list[Finding] = [
        checker_error(FAMILY, "dcgm", f"DCGM diag {name[:64]}: its summary says Fail and no "
                      "result names the part") for name in unplaced[:16]]
    for r in found[:4096]:
        if r.status not in (DCGM_FAIL, DCGM_WARN):
            continue
        comp = _component(r.entity_group, r.entity_id) if r.entity_group else "dcgm"
        why = "".join(c for c in ((r.hardware() or r.warnings[0]) if r.warnings
                                  else "no reason given")
                      if c.isprintable())[:200]
        text = f"{comp} DCGM diag {r.test}: {r.status}: {why}"
        untested = r.untested()
        if untested:
            out.append(checker_error(FAMILY, comp, f"{comp} DCGM diag {r.test} did not test: "
                                     f"{untested[:160]}"))
            continue
        code = _code("diag", r.test)
        data = {"test": r.test[:64], "dcgm": r.status, "message": why}
        if r.status == DCGM_FAIL and r.setting():
            # Failed on a setting of the node alone (persistence mode off, a CUDA environment
            # variable: qualify.dcgm_diag.SETTING_IDS), not on a part: said, never drained.
            out.append(warn(FAMILY, comp, code, f"{text} (a node setting, not the hardware)",
                            setting=True, **data))
        elif r.status == DCGM_FAIL:
            out.append(fail(FAMILY, comp, Severity.DRAIN_AFTER_JOB, code, text, repair=False,
                            **data))
        else:
            out.append(warn(FAMILY, comp, code, text, **data))
    return out
