"""Run a qualification tier on this node: each test's tool (from [qualify.tests.NAME]: plug-in,
command, timeout), bounded and in its own process group (collect/procs), its output parsed by the
plug-in. A tool that is missing, times out, dies by a signal, prints more than the bound or
exits non-zero without the plug-in finding a fault proves nothing: inconclusive, never a pass.
The tests run one after another, never together: a deep diagnostic run beside a stress test
fails for want of the GPU, not for a fault (DCGM says so in its warnings)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rsc_health.qualify import PLUGINS, parse
from rsc_health.qualify.outcome import Outcome

MAX_OUTPUT = 16 * 1024 * 1024
TIERS = ("lite", "full", "deep")


@dataclass(frozen=True)
class TestSpec:
    name: str
    plugin: str
    command: tuple[str, ...]
    timeout_s: float
    # Pairwise (pairwise.py): the server's argv, run on the peer; "{peer}" in either argv is
    # the known-good peer's name. Empty: a test of this node alone.
    server_command: tuple[str, ...] = ()
    server_wait_s: float = 2.0


class SuiteError(ValueError):
    """The tier names a test the config does not define, or a plug-in that does not exist."""


def tier_tests(cfg, tier: str) -> list[TestSpec]:
    if tier not in TIERS:
        raise SuiteError(f"unknown tier {tier!r} (tiers: {', '.join(TIERS)})")
    defined = cfg.get("qualify.tests")
    specs = []
    for name in cfg.get(f"qualify.{tier}"):
        if name not in defined:
            raise SuiteError(f"[qualify] {tier}: test {name!r} has no [qualify.tests.{name}]")
        spec = defined[name]
        if spec["plugin"] not in PLUGINS:
            raise SuiteError(f"[qualify.tests.{name}] plugin {spec['plugin']!r} unknown "
                             f"(plug-ins: {', '.join(sorted(PLUGINS))})")
        specs.append(TestSpec(name, spec["plugin"], tuple(spec["command"]),
                              float(spec.get("timeout_s", 600)),
                              tuple(spec.get("server_command", ())),
                              float(spec.get("server_wait_s", 2.0))))
    return specs


def tool_refusal(tool: str) -> str:
    """Why the tool `tool` names (on PATH, or a path) must not decide a qualification, or "":
    its output is what passes a node back into service, so, like dcgmi and the site checks, it
    must be root's (or this user's), writable by no one else, on a path no one else can swap
    (durable.trust_refusal)."""
    import os

    from rsc_health.durable import trust_refusal

    found = shutil.which(tool)
    if found is None:
        return f"tool not found: {tool!r}"
    try:
        st = os.stat(found)
    except OSError as exc:
        return f"tool {found}: {exc.strerror}"
    why = trust_refusal(st, Path(found), found)
    return f"tool {why} (someone else could make it print a pass)" if why else ""


def _dcgmi_host(command: tuple[str, ...] | list[str]) -> str:
    host = "localhost"
    for i, arg in enumerate(command):
        if arg == "--host" and i + 1 < len(command):
            host = command[i + 1]
        elif arg.startswith("--host="):
            host = arg[len("--host="):]
    return host


def hostengine_door(command: tuple[str, ...] | list[str], root: Path = Path("/")
                    ) -> tuple[str, object]:
    """checks.dcgm.host_door for the command's --host (dcgmi's default: localhost, port
    5555): (why dcgmi must not be asked, who listens there). Its verdict is nv-hostengine's, and
    where root is not the listener there any user could answer Pass: with nv-hostengine down,
    by binding the free port while dcgmi starts."""
    from rsc_health.checks.dcgm import host_door

    return host_door(root, _dcgmi_host(command))


def hostengine_moved(command: tuple[str, ...] | list[str], before, root: Path = Path("/")
                     ) -> str:
    """checks.dcgm.host_moved for the command's --host, after dcgmi ran."""
    from rsc_health.checks.dcgm import host_moved

    return host_moved(root, _dcgmi_host(command), before)


def is_pairwise(spec: TestSpec) -> bool:
    """A test of this node against a known-good peer (pairwise.py)."""
    return bool(spec.server_command) or any("{peer}" in c for c in spec.command)


def run_test(spec: TestSpec, *, deadline: float | None = None, peer: str | None = None,
             root: Path = Path("/")) -> Outcome:
    """`root`: where /proc is read (tests)."""
    from rsc_health.collect import procs

    if not spec.command or shutil.which(spec.command[0]) is None:
        return Outcome(spec.name, inconclusive=f"tool not found: {spec.command[:1]}")
    witness = None
    untrusted = tool_refusal(spec.command[0])
    if not untrusted and spec.plugin == "dcgm_diag":
        why, witness = hostengine_door(spec.command, root)
        untrusted = f"dcgmi not run: {why}" if why else ""
    if untrusted:
        return Outcome(spec.name, inconclusive=untrusted)
    timeout = spec.timeout_s
    if deadline is not None:
        timeout = min(timeout, deadline - time.monotonic())
        if timeout <= 0:
            return Outcome(spec.name, inconclusive="no time left in the tier's budget")
    if is_pairwise(spec):
        from rsc_health.qualify import pairwise

        return pairwise.run_pair(spec.name, spec.plugin, list(spec.command),
                                 list(spec.server_command), peer, timeout_s=timeout,
                                 server_wait_s=spec.server_wait_s)
    done = procs.run_all({spec.name: list(spec.command)}, timeout_s={spec.name: timeout},
                         max_bytes=MAX_OUTPUT)[spec.name]
    moved = hostengine_moved(spec.command, witness, root) if witness else ""
    if moved:  # a pass or a fail from whoever held the port meanwhile: neither stands
        return Outcome(spec.name, inconclusive=f"dcgmi's answer not believed: {moved}")
    if done.start_error:
        return Outcome(spec.name, inconclusive=f"could not start: {done.start_error[:120]}")
    if done.timed_out:
        return Outcome(spec.name, inconclusive=f"timed out after {timeout:.0f} s")
    if done.truncated:
        return Outcome(spec.name, inconclusive=f"output past {MAX_OUTPUT} bytes")
    text = done.stdout.decode("utf-8", "replace")
    out = parse(spec.plugin, text, spec.command[0])
    out.test = spec.name
    if out.failed:
        return out  # the tool found a fault: that stands whatever its exit status
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace")
        # A tool that stops at a fault it found and says so only on stderr (nvbandwidth's
        # failed copy verification): the plug-in's optional fault(stderr) names it.
        fault = getattr(PLUGINS[spec.plugin], "fault", None)
        found = fault(stderr) if fault is not None else None
        if found:
            return Outcome(spec.name, failed=found)
        err = stderr.strip().splitlines()
        return Outcome(spec.name, inconclusive=f"exit {done.returncode}"
                       + (f": {err[-1][:120]}" if err else ""))
    return out


def run_tier(cfg, tier: str, *, budget_s: float | None = None,
             peer: str | None = None) -> list[Outcome]:
    """`peer`: the known-good node pairwise tests run against (pairwise.known_good); None:
    they come out inconclusive."""
    deadline = time.monotonic() + budget_s if budget_s else None
    return [run_test(spec, deadline=deadline, peer=peer) for spec in tier_tests(cfg, tier)]
