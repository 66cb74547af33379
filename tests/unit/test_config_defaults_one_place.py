"""Config defaults are written in rsc_health/default_config.toml and nowhere else: the product
reads a documented key without a default of its own (`cfg.get("actions.guard_max_share")`),
so a default changed in the TOML is the default everywhere, and a second copy cannot drift
(`actions.never_resume_codes` read `()` in the Actor where the TOML says ten repair codes)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from rsc_health.config import PACKAGED_DEFAULTS, load_config, packaged_default, with_defaults

ROOT = Path(__file__).resolve().parents[2] / "rsc_health"
# Issue 22: these files still restate defaults; they are being restructured on other branches
# (the family contract moves checks/* and collect/*, the node path split moves nodepath.py).
# Whoever merges those removes their entry here; the scan then holds them too.
EXEMPT = frozenset({
    "checks/ecc.py", "checks/gpu.py", "checks/host.py", "checks/infiniband.py",
    "checks/mount.py", "checks/nvlink.py", "checks/pcie.py", "checks/remap.py",
    "checks/site.py", "collect/node.py",
})
# The lab (issue 22 item 4): the simulator's [sim] is read through SimConfig.from_mapping.
LAB = ("sim/",)


def _documented() -> set[str]:
    keys: set[str] = set()

    def walk(table: dict, prefix: str) -> None:
        for key, value in table.items():
            dotted = f"{prefix}{key}"
            keys.add(dotted)
            if isinstance(value, dict):
                walk(value, dotted + ".")

    walk(tomllib.loads(Path(PACKAGED_DEFAULTS).read_text()), "")
    return keys


DOCUMENTED = _documented()
SECTIONS = {key for key in DOCUMENTED if "." not in key}
LEAVES = {key.partition(".")[2] for key in DOCUMENTED if key.count(".") == 1}


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _section_of(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The documented section an expression stands for: `X.section("s")`, `X.get("s", ...)`,
    `(X.get("s") or {})`, `A if C else {}`, or a name bound to one of those."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.BoolOp):
        return next(filter(None, (_section_of(v, bound) for v in node.values)), None)
    if isinstance(node, ast.IfExp):
        return _section_of(node.body, bound) or _section_of(node.orelse, bound)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("section", "get") and node.args):
        name = _string(node.args[0])
        if name in SECTIONS:
            return name
    return None


def _scopes(tree: ast.Module):
    yield tree, False
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.name == "from_config"


def restated_defaults(source: str) -> list[tuple[int, str]]:
    """(line, what) for each documented key read with a default of its own."""
    found: dict[int, str] = {}
    tree = ast.parse(source)
    for scope, in_from_config in _scopes(tree):
        bound: dict[str, str] = {}
        nodes = [n for n in ast.walk(scope) if hasattr(n, "lineno")]
        nodes.sort(key=lambda n: (n.lineno, n.col_offset))
        for node in nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                section = _section_of(node.value, bound)
                if section:
                    bound[node.targets[0].id] = section
            if not isinstance(node, ast.Call):
                continue
            passed_on = [_string(a) for a in node.args[:-1]]  # a helper's (key, default)
            if any(key and "." in key and key in DOCUMENTED for key in passed_on):
                found[node.lineno] = ast.unparse(node)
                continue
            if not (isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and len(node.args) == 2):
                continue
            key = _string(node.args[0])
            if key is None:
                continue
            section = _section_of(node.func.value, bound)
            dotted = f"{section}.{key}" if section else key
            if dotted in SECTIONS and not isinstance(node.args[1], ast.Dict):
                continue  # a record's own field ("node"), not a config section
            if dotted in DOCUMENTED or (in_from_config and key in LEAVES):
                found[node.lineno] = f"{dotted}: {ast.unparse(node)}"
    return sorted(found.items())


def test_no_documented_config_key_is_read_with_a_default_of_its_own():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in EXEMPT or rel.startswith(LAB):
            continue
        offenders += [f"rsc_health/{rel}:{line}: {what}"
                      for line, what in restated_defaults(path.read_text())]
    assert not offenders, (
        "documented keys read with a literal default (default_config.toml is the one place):\n"
        + "\n".join(offenders))


def test_the_exemptions_are_still_needed():
    """An exempt file that no longer restates a default leaves the list (issue 22)."""
    clean = [rel for rel in sorted(EXEMPT) if not restated_defaults((ROOT / rel).read_text())]
    assert not clean, f"no longer restating defaults, remove from EXEMPT: {clean}"


@pytest.mark.parametrize("source, line", [
    ('cfg.get("actions.guard_max_share", 0.10)', 1),
    ('x = cfg.section("actions")\ny = x.get("guard_window_min", 15)', 2),
    ('x = cfg.section("report") if cfg else {}\ny = x.get("xid_top", 10)', 2),
    ('cfg.get("host", {}).get("ce_per_sweep", 100)', 1),
    ('g = cfg.get("gpu", {})', 1),
    ('g = (cfg.get("site") or {}).get("max_lines", 200)', 1),
    ('_cfg(ctx, "metrics.confidence", 0.9)', 1),
    ('class O:\n    def from_config(cls, report):\n        return report.get("xid_top", 9)', 3),
])
def test_the_scan_sees_each_way_a_default_is_restated(source, line):
    assert [ln for ln, _ in restated_defaults(source)] == [line]


@pytest.mark.parametrize("source", [
    'cfg.get("actions.guard_max_share")',
    '_cfg(ctx, "metrics.confidence")',
    'cfg.get("historian.url") or ""',
    'os.environ.get("RSC_HEALTH_DB", "")',
    'spec.get("timeout_s", 600)',  # not a documented key: [qualify.tests.NAME] is a map
    'kept.get("settings", {})',
    'rec.get("node", "")',  # a record's field named like a section
])
def test_the_scan_leaves_reads_without_a_default_alone(source):
    assert restated_defaults(source) == []


def test_a_documented_key_missing_from_a_config_reads_its_packaged_default():
    cfg = load_config("/dev/null")
    del cfg.data["actions"]["never_resume_codes"]
    del cfg.data["report"]
    assert cfg.get("actions.never_resume_codes") == packaged_default("actions.never_resume_codes")
    assert "xid79" in cfg.get("actions.never_resume_codes")
    assert cfg.get("report.metrics_days") == 330
    assert cfg.get("report.no_such_key") is None
    assert cfg.get("report.no_such_key", 7) == 7  # an undocumented key may still say its own


def test_the_actor_never_auto_resumes_repair_codes_from_a_trimmed_config(tmp_path):
    from rsc_health.actions import Actor

    cfg = load_config("/dev/null")
    del cfg.data["actions"]["never_resume_codes"]
    actor = Actor(slurm=None, cfg=cfg, node="n1", state_dir=tmp_path, log=lambda _msg: None)
    assert {"xid79", "ecc_dbe", "gpu_lost"} <= actor.never_resume


def test_from_config_helpers_take_the_packaged_defaults_for_what_a_section_leaves_out():
    from rsc_health.historian.attribute import Window
    from rsc_health.historian.retention import Retention
    from rsc_health.report.gather import GatherOptions

    opts = GatherOptions.from_config({"xid_top": 3}, {})
    assert (opts.xid_top, opts.metrics_days, opts.listed_days_max) == (
        3, packaged_default("report.metrics_days"), packaged_default("report.listed_days_max"))
    assert opts.stale_after_s == packaged_default("historian.stale_after_s")
    assert GatherOptions().confidence == packaged_default("metrics.confidence")
    assert Window.from_config(None) == Window(**with_defaults("attribution"))
    assert Retention.from_config(None).days == packaged_default("historian.retention_days")
