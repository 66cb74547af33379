"""The family contract, for every family in checks.REGISTRY: a family that forgets any part
of it fails here, not on a fleet.

For each family, on a copy of tests/fixtures/nodes/healthy: its config section exists in
default_config.toml and every key in it is typed (an empty list's items too); `healthctl check
--only NAME` gives at least one finding of it on the healthy node and finds a fault written
into what it declares it reads; `prolog_families = [NAME]` runs it in a real prolog
(nodepath.run_stage) that spools that fault; a live `healthctl snapshot` replays
(`check --from`) to the live verdict and findings; its name is valid in every config list
that names families; the README's family table has its row. And no module of
rsc_health.collect imports rsc_health.checks (the shared readers stay below the families).

A new family adds its FAULTS entry below: how to break a node for it through its inputs.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health import nodepath
from rsc_health.checks import FAMILIES, REGISTRY
from rsc_health.cli import cli
from rsc_health.config import PACKAGED_DEFAULTS, ConfigError, _read_toml, load_config, validated
from rsc_health.config_schema import FAMILY_LISTS, Spec, infer
from rsc_health.engine import run
from tests.fixtures.nodes.node_copy import HEALTHY, NODE_STATE, copy_node
from tests.node.test_state_dir_read_only import node01_slurm

REPO = Path(__file__).resolve().parents[2]
XID79 = ("4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has "
         "fallen off the bus.\n")
# A fatal NVSwitch error as the nvidia-nvswitch driver prints it (tests/fixtures/sxid/README.md).
SXID20034 = ("3,9001,99000001,-;nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 "
             "LTSSM Fault Up\n")


def _nvml(edit: Callable[[list], None]) -> Callable[[Path], None]:
    def inject(root: Path) -> None:
        path = root / "rsc_health/nvml.json"
        doc = json.loads(path.read_text())
        edit(doc["devices"])
        path.write_text(json.dumps(doc))
    return inject


def _write(rel: str, text: str) -> Callable[[Path], None]:
    def inject(root: Path) -> None:
        path = (root / rel).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return inject


def _append(rel: str, text: str) -> Callable[[Path], None]:
    def inject(root: Path) -> None:
        with (root / rel).open("a") as fh:
            fh.write(text)
    return inject


def _gpu_link_width(width: str) -> Callable[[Path], None]:
    def inject(root: Path) -> None:
        devices = sorted((root / "sys/bus/pci/devices").iterdir())
        gpu = next(d for d in devices if (d / "class").read_text().strip() == "0x030200")
        (gpu / "current_link_width").write_text(width + "\n")
    return inject


def _drop_mount(path: str) -> Callable[[Path], None]:
    def inject(root: Path) -> None:
        table = root / "proc/mounts"
        table.write_text("".join(line for line in table.read_text().splitlines(True)
                                 if line.split()[1] != path))
    return inject


def _leftover(root: Path) -> None:
    """A process of job 17, which no longer runs here (no step socket), holding 2 GiB on gpu2:
    /proc as the kernel shows it (cgroup v2 under slurmstepd.scope), a spool dir with only the
    prolog's own job (4242) in it."""
    _nvml(lambda gpus: gpus[2].update(processes=[{"pid": 4321, "used_memory": 2 << 30}]))(root)
    proc = root / "proc/4321"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_17/step_0/user/task_0\n")
    (proc / "comm").write_text("python3\n")
    (proc / "status").write_text("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                     "alice:x:1000:1000::/home/alice:/bin/bash\n")
    spool = root / "var/spool/slurmd"
    spool.mkdir(parents=True)
    (spool / "node01_4242.4294967292").write_text("")


def _systemctl(answer: str, code: int) -> Callable[[Path], None]:
    """A stand-in for systemctl under the root: `is-active UNIT` prints the unit's state and
    exits as systemctl does (0 active, 3 inactive)."""
    def inject(root: Path) -> None:
        program = root / "usr/bin/systemctl"
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text(f"#!/bin/sh\necho {answer}\nexit {code}\n")
        program.chmod(0o755)
    return inject


def _fabric_healthy(root: Path) -> None:
    _systemctl("active", 0)(root)
    _nvml(lambda gpus: [g.update(fabric={"state": 3, "status": 0, "clique_id": 1,
                                         "cluster_uuid": "00" * 16, "health_mask": 0})
                        for g in gpus])(root)


def _dcgmi(incidents: list) -> Callable[[Path], None]:
    """A dcgmi stand-in under the root printing `dcgmi health -c -j` as DCGM writes it."""
    from rsc_health.sim.qualify_tools import dcgm_health

    def inject(root: Path) -> None:
        (root / "dcgm-health.json").write_text(dcgm_health(incidents))
        program = root / "usr/bin/dcgmi"
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text(f"#!/bin/sh\ncat '{root / 'dcgm-health.json'}'\n")
        program.chmod(0o755)
    return inject


SITE_DIR = "etc/rsc_health/site.d"


def _site_program(line: str) -> Callable[[Path], None]:
    def inject(root: Path) -> None:
        program = root / SITE_DIR / "disk"
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text(f"#!/bin/sh\necho '{line}'\n")
        program.chmod(0o755)
    return inject


# family -> (config that switches it on, if its default is off; its healthy inputs, if the
# fixture lacks them; a fault written into what it reads; the code that fault must give).
FAULTS: dict[str, tuple[str, Callable[[Path], None] | None, Callable[[Path], None], str]] = {
    "gpu": ("", None, _nvml(lambda gpus: gpus[3].update(
        {k: {"error": "NVML_ERROR_GPU_IS_LOST"} for k in ("temperature", "ecc_mode")})),
        "gpu_lost"),
    "xid": ("", None, _append("dev/kmsg", XID79), "xid79"),
    "sxid": ("", None, _append("dev/kmsg", SXID20034), "sxid20034"),
    "ecc": ("", None, _nvml(lambda gpus: gpus[4]["ecc"]["volatile"].update(uncorrected=2)),
            "ecc_dbe"),
    "remap": ("", None, _nvml(lambda gpus: gpus[6]["remapped_rows"].update(failure=True)),
              "remap_failed"),
    "nvlink": ("", None, _nvml(lambda gpus: gpus[1]["nvlink"][5].update(state=0)),
               "nvlink_down"),
    "pcie": ("", None, _gpu_link_width("8"), "pcie_downtrained"),
    "infiniband": ("", None, _write("sys/class/infiniband/mlx5_2/ports/1/state", "1: DOWN\n"),
                   "ib_down"),
    "mount": ("", None, _drop_mount("/home"), "mount_missing"),
    "host": ("", None, _write("sys/devices/system/edac/mc/mc1/ue_count", "2\n"), "edac_ue"),
    # A busy GPU whose link trained at Gen3: the telemetry family's own judgement.
    "telemetry": ("", None, _nvml(lambda gpus: (gpus[2]["telemetry"]["utilization"].update(gpu=97),
                                                gpus[2]["pcie"].update(gen=3))),
                  "gpu_pcie_slow"),
    "leftover": ("", None, _leftover, "gpu_process_leftover"),
    "dcgm": ("[dcgm]\nenabled = true\n", _dcgmi([]),
             _dcgmi([("GPU", 3, "Memory system", "Failure", "A volatile double-bit ECC error "
                      "has occurred on GPU 3")]), "dcgm_health_memory"),
    "fabric": ('[fabric]\nnvswitch = "yes"\n', _fabric_healthy, _systemctl("inactive", 3),
               "fabric_manager_down"),
    "site": (f'[site]\nchecks_dir = "/{SITE_DIR}"\n',
             _site_program("ok none disk0 disk_ok disk0 answers"),
             _site_program("fail drain_after_job disk0 disk_gone disk0 is gone"), "disk_gone"),
}


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def _node(tmp_path: Path, name: str) -> tuple[Path, Path]:
    if name not in FAULTS:
        pytest.fail(f"family {name!r} has no FAULTS entry in {Path(__file__).name}: say how "
                    f"to break a node through what it reads")
    on, healthy, _, _ = FAULTS[name]
    root = copy_node(tmp_path / "node", HEALTHY)
    if healthy is not None:
        healthy(root)
    config = root / "site.toml"
    config.write_text((root / "config.toml").read_text() + "\n" + on
                      + f'\n[slurm]\nprolog_families = ["{name}"]\n')
    return root, config


def _check(root: Path, config: Path | str, *args: str) -> dict:
    res = CliRunner().invoke(cli, ["--root", str(root), "--config", str(config), "check",
                                   "--json", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return json.loads(res.output)


def _key(doc: dict) -> list[tuple]:
    return sorted((f["family"], f["component"], f["code"], f["status"], f["severity"])
                  for f in doc["findings"])


def _untyped(spec: Spec, where: str) -> list[str]:
    if spec.kind == "any":
        return [where]
    out = _untyped(spec.item, where + "[]") if spec.item is not None else []
    for key, sub in spec.fields.items():
        out += _untyped(sub, f"{where}.{key}")
    return out


def test_its_config_section_exists_and_every_key_is_typed(family):
    fam = next(f for f in REGISTRY if f.name == family)
    defaults = _read_toml(PACKAGED_DEFAULTS)
    assert isinstance(defaults.get(fam.config), dict), (
        f"[{fam.config}] (family {family}) is not in default_config.toml")
    untyped = [w for key, value in defaults[fam.config].items()
               for w in _untyped(infer(value, f"{fam.config}.{key}"), f"{fam.config}.{key}")]
    assert untyped == [], (f"untyped keys (give Family.types or config_schema.EXPLICIT): "
                           f"{untyped}")


def test_check_only_runs_it_healthy_and_finds_a_fault_in_its_inputs(family, tmp_path):
    root, config = _node(tmp_path, family)
    healthy = _check(root, config, "--only", family)
    own = [f for f in healthy["findings"] if f["family"] == family]
    assert own, f"`check --only {family}` looked at nothing: {healthy['findings']}"
    assert healthy["verdict"]["exit_code"] == 0, healthy["findings"]
    run(load_config(config), root)  # a sweep's baselines: counters rise from here
    FAULTS[family][2](root)
    broken = _check(root, config, "--only", family)
    codes = {f["code"] for f in broken["findings"] if f["family"] == family}
    assert FAULTS[family][3] in codes, broken["findings"]
    assert broken["verdict"]["exit_code"] != 0


def test_a_prolog_with_only_it_in_prolog_families_runs_it(family, tmp_path, monkeypatch):
    root, config = _node(tmp_path, family)
    run(load_config(config), root)
    FAULTS[family][2](root)
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(config))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    nodepath.run_stage("prolog", slurm_factory=lambda c, d: node01_slurm())
    spool = root / NODE_STATE / "spool" / "pending.jsonl"
    records = [json.loads(line) for line in spool.read_text().splitlines()]
    checks = {(r["check"], r["code"]) for r in records if r["kind"] == "check"}
    assert (family, FAULTS[family][3]) in checks, sorted(checks)
    assert {c for c, _ in checks} <= {family, "checker"}


def test_a_live_snapshot_replays_to_the_live_verdict(family, tmp_path):
    root, config = _node(tmp_path, family)
    run(load_config(config), root)
    FAULTS[family][2](root)
    live = _check(root, config, "--only", family)
    out = tmp_path / "snapshot.json"
    res = CliRunner().invoke(cli, ["--root", str(root), "--config", str(config), "snapshot",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    # Replayed elsewhere: another root, the snapshot's own config.
    replayed = _check(tmp_path / "elsewhere", os.devnull, "--from", str(out), "--only", family)
    assert _key(replayed) == _key(live)
    assert replayed["verdict"] == live["verdict"]


def test_its_name_is_valid_in_every_config_list_of_families(family):
    for dotted in FAMILY_LISTS:
        section, key = dotted.split(".")
        validated({section: {key: [family]}}, "site.toml")
    with pytest.raises(ConfigError):
        validated({"slurm": {"prolog_families": [family + "x"]}}, "site.toml")


def test_the_readme_family_table_lists_it(family):
    rows = re.findall(r"^\| `([a-z_]+)` \|", (REPO / "README.md").read_text(), re.M)
    assert family in rows, f"README.md's family table has no row for `{family}`"


def test_collect_never_imports_checks():
    """The shared readers sit below the families: checks import collect, never the reverse
    (on main, collect/node.py imported checks.REGISTRY while every check imported collect)."""
    offenders = []
    for path in sorted((REPO / "rsc_health/collect").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names
                          if n == "rsc_health.checks" or n.startswith("rsc_health.checks.")]
    assert offenders == []


def test_every_kernel_log_cursor_is_local_state_a_snapshot_carries():
    """A family's cursor (Family.cursor) is node-local state: a snapshot carries it and a
    replay judges "new since the last sweep" as the node did."""
    from rsc_health.engine import STATE_FILES

    cursors = {f.cursor for f in REGISTRY if f.cursor}
    assert cursors and cursors <= set(STATE_FILES)
    assert len(cursors) == len([f for f in REGISTRY if f.cursor])  # one file per family


@pytest.mark.parametrize("family", [f.name for f in REGISTRY if f.counters_own])
def test_a_family_whose_counters_are_its_own_has_none_when_it_did_not_run(family, tmp_path):
    """checks.state._read_counters skips a counters_own family that did not run (a prolog does
    not import host or telemetry for them): every other family's state gives it none, while
    its own collect gives it some on the healthy node."""
    from rsc_health.checks import BY_NAME
    from rsc_health.checks.state import collect_all

    root = copy_node(tmp_path / "node")
    cfg = load_config(root / "config.toml")
    others, _ = collect_all(cfg, str(root), only=set(FAMILIES) - {family})
    assert BY_NAME[family].counters(others) == {}
    own, _ = collect_all(cfg, str(root), only={family})
    assert BY_NAME[family].counters(own)


@pytest.mark.parametrize("family", [f.name for f in REGISTRY
                                    if f.counters is not None and f.rates_prefix is None])
def test_every_per_sweep_counter_key_is_under_its_familys_prefixes(family, tmp_path):
    """A family whose counters are judged per sweep names their key prefixes
    (Family.counter_prefixes): a sweep forgets the baselines of them it did not read
    (engine._forget_unread). A key outside them would keep an old baseline under the
    family's new time, its rise over several sweeps judged against one sweep's limit."""
    from rsc_health.checks import BY_NAME
    from rsc_health.checks.state import collect_all

    fam = BY_NAME[family]
    root = copy_node(tmp_path / "node")
    cfg = load_config(root / "config.toml")
    state, _ = collect_all(cfg, str(root), only={family})
    keys = fam.counters(state)
    assert keys, f"{family}: no counter read on the healthy fixture node"
    outside = [k for k in keys if not k.startswith(fam.counter_prefixes)]
    assert fam.counter_prefixes and outside == [], (family, outside)
