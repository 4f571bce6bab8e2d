"""Configuration loading and validation, in one process."""

from __future__ import annotations

import pytest

from mpirl.config import Config, ConfigError, build_parser, parse_args


def test_every_field_has_help_and_a_flag():
    text = build_parser().format_help()
    for name in Config.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in text


def test_yaml_then_flags_override(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("topology: ring\nlr: 1\nhidden: [32, 16]\nlayer_norm: true\n")
    cfg = parse_args(["--config", str(path), "--seed", "7", "--no-layer-norm"])
    assert (cfg.topology, cfg.lr, cfg.hidden, cfg.seed, cfg.layer_norm) == \
        ("ring", 1.0, [32, 16], 7, False)


def test_saved_config_loads_back_identically(tmp_path):
    cfg = Config(topology="tree", hidden=[8], seed=3)
    cfg.save(tmp_path / "c.yaml")
    assert Config.from_yaml(tmp_path / "c.yaml") == cfg


def test_unknown_field_is_named(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("topolgy: ring\n")
    with pytest.raises(ConfigError, match="unknown field.*topolgy.*valid fields:"):
        Config.from_yaml(path)


def test_wrong_type_is_named(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("num_envs: four\n")
    with pytest.raises(ConfigError, match="num_envs='four' is a str; expected int"):
        Config.from_yaml(path)


def test_invalid_yaml_reports_the_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("seed: 1\ntopology: [ring\nlr: 0.1\n")
    with pytest.raises(ConfigError, match=r"exp.yaml line \d+: not valid YAML"):
        Config.from_yaml(path)


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        Config.from_yaml(tmp_path / "absent.yaml")


@pytest.mark.parametrize("changes, fragment", [
    ({"gamma": 1.5}, "gamma=1.5; allowed: [0.0, 1.0]"),
    ({"num_envs": 0}, "num_envs=0; allowed: >= 1"),
    ({"hidden": [64, 0]}, "hidden=[64, 0]"),
    ({"activation": "gelu"}, "choose one of: tanh, relu, elu"),
    ({"topology": "hierarchical", "inner": "hierarchical"},
     "inner='hierarchical' is not allowed; choose one of: native, star"),
    ({"topology": "hierarchical", "node_size": -1}, "node_size=-1; allowed: >= 0"),
    ({"topology": "ring", "inner": "tree"},
     "inner='tree' applies to topology hierarchical only"),
    ({"topology": "ring", "node_size": 2}, "node_size=2 applies to topology hierarchical only"),
    ({"topology": "ring", "cost_params": "p.json"},
     "cost_params='p.json' applies to topology auto only"),
    ({"topology": "auto", "cost_params": "/nonexistent/params.json"},
     "auto: cannot read cost-model parameters from '/nonexistent/params.json'"),
])
def test_validation_names_field_and_allowed_values(changes, fragment):
    cfg = Config(**changes)
    with pytest.raises(ConfigError) as info:
        cfg.validate(world_size=2)
    assert fragment in str(info.value)


def test_defaults_are_valid():
    Config().validate(world_size=4)


def test_hierarchical_options_make_the_topology_spec():
    assert Config(topology="ring").topology_spec == "ring"
    assert Config(topology="hierarchical").topology_spec == "hierarchical:ring"
    cfg = Config(topology="hierarchical", inner="butterfly", node_size=2)
    cfg.validate(world_size=4)
    assert cfg.topology_spec == "hierarchical:butterfly:2"
    assert Config(topology="auto", cost_params="fit/params.json").topology_spec == \
        "auto:fit/params.json"


def test_a_replay_rank_must_be_able_to_hold_its_warm_up():
    """apex's replay ranks (gorila's with service replay) answer no sample request before
    they hold ceil(learning_starts / R) transitions: one that cannot would never answer."""
    apex = dict(mode="apex", replay_ranks=2, replay_capacity=1201)
    with pytest.raises(ConfigError, match=r"^learning_starts=1201 over 2 replay rank\(s\) "
                       r"is 601 each, more than the 600 each holds \(replay_capacity=1201\); "
                       r"allowed: learning_starts <= 1200$"):
        Config(**apex, learning_starts=1201).validate(world_size=5)
    Config(**apex, learning_starts=1200).validate(world_size=5)
    with pytest.raises(ConfigError, match="learning_starts=90 over 1 replay rank"):
        Config(mode="gorila", gorila_replay="service", replay_capacity=80, replay_batch=32,
               learning_starts=90).validate(world_size=3)
    # each worker's own replay (gorila local, sync-replay) warms on learning_starts // workers
    local = dict(mode="sync-replay", replay_capacity=80, replay_batch=32, learning_starts=161)
    with pytest.raises(ConfigError) as refused:
        Config(**local).validate(world_size=1)
    assert str(refused.value) == ("learning_starts=161 over 1 worker replay(s) is 161 each, "
                                  "more than the 80 each holds (replay_capacity=80); allowed: "
                                  "learning_starts <= 80")
    Config(**local).validate(world_size=2)             # 80 each
    with pytest.raises(ConfigError, match="over 1 worker replay"):
        Config(**{**local, "mode": "gorila"}).validate(world_size=2)   # a server, a worker
    Config(**{**local, "mode": "gorila"}).validate(world_size=3)


def test_server_modes_need_a_worker_and_the_star():
    with pytest.raises(ConfigError, match="needs at least 2 ranks"):
        Config(mode="async", topology="star").validate(world_size=1)
    with pytest.raises(ConfigError, match="use --topology star"):
        Config(mode="quorum", topology="ring").validate(world_size=4)
    assert Config(mode="quorum", topology="star").quorum_size(world_size=6) == 3


def test_yaml_floats_without_a_dot_are_floats(tmp_path):
    """PyYAML (YAML 1.1) reads 3e-4 as a string; a float field takes it as the number."""
    path = tmp_path / "exp.yaml"
    path.write_text("lr: 3e-4\nvalue_coef: 1E0\nmax_grad_norm: '0.5e1'\n")
    cfg = Config.from_yaml(path)
    assert (cfg.lr, cfg.value_coef, cfg.max_grad_norm) == (3e-4, 1.0, 5.0)
    path.write_text("lr: 3e-4x\n")
    with pytest.raises(ConfigError, match="lr='3e-4x' is a str; expected float"):
        Config.from_yaml(path)


def test_delay_tails_are_bounded_so_costs_stay_finite():
    for tail in ("inf", "nan", "0", "1e400", "25"):
        with pytest.raises(ConfigError, match=r"tail=.* a number in \[0.05, 20\]"):
            Config(env="Delay-v0", env_arg=["dist=pareto", f"tail={tail}"]).validate(2)
    import gymnasium

    env = gymnasium.make("Delay-v0", cost_s=1.0, dist="pareto", tail=0.05).unwrapped
    env.reset(seed=0)
    assert max(env.draw_cost() for _ in range(2000)) <= 3600.0


def test_env_args_are_typed_from_yaml_and_checked():
    cfg = Config(env="Delay-v0", env_arg=["cost_s=0.5", "dist=pareto", "obs_dim=7"])
    assert cfg.env_kwargs() == {"cost_s": 0.5, "dist": "pareto", "obs_dim": 7}
    # YAML 1.2's floats without a dot are numbers (PyYAML's YAML 1.1 reads them as text)
    assert Config(env_arg=["a=5e-5", "b=-1E3", "c=1.5e3", "d=.5e1", "e=e5", "f=5e",
                           "g=1e5x", "h=0x1e5", "i=1.2.3"]).env_kwargs() == \
        {"a": 5e-5, "b": -1000.0, "c": 1500.0, "d": 5.0, "e": "e5", "f": "5e", "g": "1e5x",
         "h": 0x1e5, "i": "1.2.3"}
    cfg.validate(world_size=2)
    with pytest.raises(ConfigError, match="Delay-v0 has no argument 'colour'"):
        Config(env="Delay-v0", env_arg=["colour=red"]).validate(world_size=2)


@pytest.mark.parametrize("fields, message", [
    ({"mode": "sync", "quorum": 2}, "quorum=2 is not taken by mode='sync'; allowed with mode "
                                    "quorum"),
    ({"mode": "impala", "late": "apply"}, "late='apply' is not taken by mode='impala'"),
    ({"mode": "gorila", "topology": "star", "train_intensity": 4.0},
     "train_intensity=4.0 is not taken by mode='gorila'; allowed with mode apex"),
    ({"mode": "apex", "gorila_replay": "service"}, "allowed with mode gorila .*'local'"),
    ({"mode": "seed", "refresh_every": 3}, "refresh_every=3 is not taken by mode='seed'"),
])
def test_an_option_another_design_owns_is_refused(tmp_path, fields, message):
    """A design's own options (its registry row) set under another design would play no
    part: one line at start, naming the designs that take it and the default."""
    with pytest.raises(ConfigError, match=message):
        Config(run_dir=str(tmp_path), **fields).validate(4)


@pytest.mark.parametrize("mode", ["impala", "seed", "ga3c", "apex"])
def test_fail_and_nan_skip_are_refused_where_no_guard_acts_on_them(tmp_path, mode):
    """These designs' learners use gradients unchecked: ``--fail`` would never fire and
    ``--nan-policy skip`` never skip; one line names the designs that take them."""
    allowed = "mode sync, sync-replay, async, quorum, gorila"
    with pytest.raises(ConfigError, match=f"fail with mode='{mode}': .* {allowed}"):
        Config(run_dir=str(tmp_path), mode=mode, fail=["2@5"]).validate(4)
    with pytest.raises(ConfigError, match=f"nan_policy='skip' with mode='{mode}'"):
        Config(run_dir=str(tmp_path), mode=mode, nan_policy="skip").validate(4)
    Config(run_dir=str(tmp_path), mode="sync-replay", fail=["2@5"]).validate(4)


def test_a_design_starts_from_its_own_defaults_where_the_user_set_nothing(tmp_path):
    """gorila's lr (its registry row's defaults) where neither a flag nor the YAML file
    sets it; a value the user gives wins, and a resumed run keeps its saved one."""
    assert parse_args(["--mode", "gorila"]).lr == 5e-4
    assert parse_args(["--mode", "sync"]).lr == Config().lr == 1e-3
    assert parse_args(["--mode", "gorila", "--lr", "0.002"]).lr == 0.002
    (tmp_path / "a.yaml").write_text("mode: gorila\nlr: 0.003\n")
    (tmp_path / "b.yaml").write_text("mode: sync\n")
    assert parse_args(["--config", str(tmp_path / "a.yaml")]).lr == 0.003
    assert parse_args(["--config", str(tmp_path / "b.yaml"), "--mode", "gorila"]).lr == 5e-4
    run = tmp_path / "run"
    run.mkdir()
    Config(mode="gorila", topology="star", lr=1e-3).save(run / "config.yaml")
    assert parse_args(["--resume", str(run)]).lr == 1e-3
    # --config FILE --resume RUN_DIR builds the run from FILE: with the design's defaults
    (tmp_path / "c.yaml").write_text("mode: sync-replay\n")
    both = parse_args(["--config", str(tmp_path / "c.yaml"), "--resume", str(run)])
    assert (both.update_repeat, both.checkpoint_every) == (8, 5000)
    assert "(default: 0.001; gorila: 0.0005)" in " ".join(build_parser().format_help().split())
    # the server designs take only the star: it is their default, a flag still overrides
    assert parse_args(["--mode", "async"]).topology == "star"
    assert parse_args(["--mode", "quorum"]).topology == "star"
    assert parse_args(["--mode", "sync"]).topology == "butterfly"
    assert "(default: butterfly; async: star; quorum: star)" in \
        " ".join(build_parser().format_help().split())


def test_resume_saves_the_flags_given_on_top_or_what_a_config_file_changes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    Config.from_dict({"mode": "sync", "lr": 0.003, "total_steps": 6400, "fail": ["1@5"],
                      "run_dir": str(tmp_path), "run_name": "run"}).save(run / "config.yaml")
    plain = parse_args(["--resume", str(run)])
    assert plain.resumed_with == ("resume",) and plain.save_resumed(run / "config.yaml") == []
    more = parse_args(["--resume", str(run), "--total-steps", "12800"])
    assert more.save_resumed(run / "config.yaml") == ["total_steps 6400 -> 12800"]
    saved = Config.from_yaml(run / "config.yaml")
    assert (saved.total_steps, saved.lr, saved.fail, saved.resume) == (12800, 0.003, ["1@5"], "")
    # the run built from a file of its own: every field that differs is saved (a later
    # plain --resume goes on as this one did), the file's fail list never
    other = tmp_path / "other.yaml"
    Config.from_dict({"mode": "sync", "total_steps": 99, "fail": ["0@1"]}).save(other)
    mixed = parse_args(["--config", str(other), "--resume", str(run), "--seed", "4"])
    assert mixed.save_resumed(run / "config.yaml") == \
        ["seed 1 -> 4", "total_steps 12800 -> 99", "lr 0.003 -> 0.001"]
    saved = Config.from_yaml(run / "config.yaml")
    assert (saved.total_steps, saved.lr, saved.seed, saved.fail) == (99, 0.001, 4, ["1@5"])
    assert (saved.run_dir, saved.run_name) == (str(tmp_path), "run")    # where it lives
