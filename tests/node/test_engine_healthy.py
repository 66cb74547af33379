from rsc_health.model import Level, Status

from .conftest import bad


def test_healthy_fixture_is_ok_with_every_component_looked_at(node):
    findings, verdict = node.check()
    assert bad(findings) == []
    assert verdict.level is Level.OK
    comps = {(f.family, f.component) for f in findings}
    assert {("gpu", f"gpu{i}") for i in range(8)} <= comps
    assert {("nvlink", f"gpu{i}") for i in range(8)} <= comps
    assert {("infiniband", f"mlx5_{i}/1") for i in range(8)} <= comps
    assert {("mount", p) for p in ("/", "/home", "/checkpoint")} <= comps
    nvlink = [f for f in findings if f.family == "nvlink"]
    assert all(f.reason.endswith("18 NVLinks active") for f in nvlink)


def test_only_runs_just_the_named_families(node):
    findings, _ = node.check(only={"mount"})
    assert {f.family for f in findings} == {"mount"}


def test_unknown_family_is_a_checker_error_not_a_drain(node):
    findings, verdict = node.check(only={"mount", "bogus"})
    errors = [f for f in findings if f.status is Status.ERROR]
    assert [f.component for f in errors] == ["bogus"]
    assert verdict.level is Level.CHECKER_ERROR


def test_engine_never_raises_on_an_empty_root(tmp_path, node):
    findings, verdict = node.check()  # warm
    from rsc_health.engine import run

    out = run(node.config, tmp_path / "nothing-here")
    # No mount table: the checker says it could not look, instead of "every mount missing".
    assert not [f for f in out if f.family == "mount"]
    assert any(f.status is Status.ERROR and f.reason.startswith("mount: cannot read")
               for f in out)


def test_state_lives_under_the_root(node):
    node.check()
    state = node.path("var/lib/rsc_health")
    assert (state / "xid_cursor.json").exists() and (state / "counters.json").exists()
