import pytest

from rsc_health.config import ConfigError, load_config, state_dir


def test_defaults_load_without_site_file(tmp_path, monkeypatch):
    monkeypatch.delenv("RSC_HEALTH_CONFIG", raising=False)
    cfg = load_config("/dev/null")
    assert cfg.get("node.state_dir") == "/var/lib/rsc_health"


def test_broken_file_names_path_and_problem(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[node\nstate_dir = 1\n")
    with pytest.raises(ConfigError, match=str(bad)):
        load_config(bad)


def test_explicitly_named_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")


def test_unknown_section_is_an_error(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[nodez]\nx = 1\n")
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(f)


def test_node_glob_overrides_partition_overrides_site(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(
        '[node]\nstate_dir = "/a"\n'
        '[partitions.big.node]\nstate_dir = "/b"\n'
        '[nodes."gpu-1*".node]\nstate_dir = "/c"\n'
    )
    cfg = load_config(f)
    assert cfg.get("node.state_dir") == "/a"
    assert cfg.for_node("gpu-20", "big").get("node.state_dir") == "/b"
    assert cfg.for_node("gpu-10", "big").get("node.state_dir") == "/c"


def test_state_dir_lives_under_root(tmp_path):
    cfg = load_config("/dev/null")
    assert state_dir(cfg, tmp_path) == str(tmp_path / "var/lib/rsc_health")
