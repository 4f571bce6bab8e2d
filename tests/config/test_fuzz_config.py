"""Property-based tests (hypothesis) of the configuration: any mapping, any YAML file,
any command line.

Configurations: any mapping is either accepted, and then every documented range holds and
the configuration survives a save and a load, or rejected with a one-line ConfigError
that names a field the mapping set.  Any file content either loads or raises ConfigError,
naming the line when the YAML is invalid.  (Topology inputs are fuzzed under mpiexec in
tests/topologies/test_fuzz_topologies.py.)
"""

from __future__ import annotations

import math
import re
import tempfile
from dataclasses import fields
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings, strategies as st

import topologies
from mpirl.config import (ACTIVATIONS, LATE_POLICIES, MODES, Config, ConfigError,
                          parse_args, parse_stragglers)
from mpirl.config import FAIL_KINDS, NAN_POLICIES, parse_faults

FIELDS = {f.name: f for f in fields(Config)}
DEFAULTS = Config()

# -- strategies -----------------------------------------------------------------------------
floats = st.floats(allow_nan=True, allow_infinity=True)
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | floats | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=2),
    max_leaves=5)
numbers = st.integers(-3, 10**6) | floats | st.sampled_from([0, 1, 0.0, 1.0, 0.1, -0.0, 1e-9])
ints = st.integers(-3, 3) | st.integers(-10**7, 10**12)


def spec_list(pattern: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(pattern | st.text(max_size=8) | ints, max_size=3)


FIELD_VALUES = {
    "topology": st.sampled_from([*topologies.names(), "hypercube", ""]),
    "mode": st.sampled_from([*MODES, "eventual"]),
    "late": st.sampled_from([*LATE_POLICIES, "keep"]),
    "activation": st.sampled_from([*ACTIVATIONS, "gelu"]),
    "nan_policy": st.sampled_from([*NAN_POLICIES, "ignore"]),
    "env": st.sampled_from(["CartPole-v1", "Delay-v0", "L2Run-v0", "Pendulum-v1",
                            "CartPol-v1", ""]),
    "env_arg": spec_list(st.builds(
        "{}={}".format, st.sampled_from(["cost_s", "dist", "tail", "obs_dim", "busy",
                                         "episode_steps", "difficulty", "colour", ""]),
        st.sampled_from(["0.01", "-1", "2", "lognormal", "spin", ".nan", ".inf", "[1, 2]",
                         "{a: 1}", "x: y: z", "'", "!!int q", "!!float", ""]))),
    "straggler": spec_list(st.builds("{}:{}".format, st.integers(-1, 9),
                                     st.sampled_from(["1", "3", "0.5", "nan", "inf", "1e400",
                                                      "x"]))),
    "fail": spec_list(st.builds("{}@{}{}".format, st.integers(-1, 9), st.integers(-1, 5),
                                st.sampled_from(["", *(":" + k for k in FAIL_KINDS),
                                                 ":melt"]))),
    "hidden": st.lists(st.integers(-2, 300) | st.booleans() | floats, max_size=3),
    "resume": st.sampled_from(["", "no/such/run"]),
}


def field_value(name: str) -> st.SearchStrategy:
    """Values of the field's own type near its limits, or anything at all."""
    kind = type(getattr(DEFAULTS, name))
    if name in FIELD_VALUES:
        typed = FIELD_VALUES[name]
    elif kind is bool:
        typed = st.booleans()
    elif kind is int:
        typed = ints
    elif kind is float:
        typed = numbers
    elif kind is str:
        typed = st.text(max_size=12)
    else:
        typed = st.lists(st.integers(), max_size=3)
    return st.one_of(typed, typed, junk)


config_dicts = st.fixed_dictionaries(
    {}, optional={name: field_value(name) for name in FIELDS}).flatmap(
    lambda known: st.dictionaries(st.text(max_size=10) | st.integers() | st.none()
                                  | st.booleans(), junk, max_size=2).map(
        lambda extra: {**extra, **known}))


# -- what the documentation promises ----------------------------------------------------------
def at_least(low):
    return lambda v: v >= low


def within(low, high, low_open=False):
    return lambda v: (low < v if low_open else low <= v) and v <= high


#: every documented range (`python -m mpirl.run --help`), written out independently of
#: the validation code
RANGES = {
    **{name: at_least(1) for name in ("total_steps", "num_envs", "rollout_steps", "log_every",
                                      "action_repeat", "update_repeat", "log_flush_every")},
    **{name: at_least(0) for name in ("checksum_every", "torch_threads", "checkpoint_every",
                                      "value_coef", "entropy_coef", "max_grad_norm",
                                      "watchdog_s")},
    "wait_timeout_s": at_least(0.1),
    "lr": within(0.0, 1.0, low_open=True),
    **{name: within(0.0, 1.0) for name in ("gamma", "gae_lambda", "clip_ratio")},
    "mode": lambda v: v in MODES,
    "topology": lambda v: v in topologies.names(),
    "late": lambda v: v in LATE_POLICIES,
    "activation": lambda v: v in ACTIVATIONS,
    "nan_policy": lambda v: v in NAN_POLICIES,
    "hidden": lambda v: len(v) > 0 and all(type(h) is int and h > 0 for h in v),
}


def check_documented_ranges(cfg: Config, world_size: int) -> None:
    for name, ok in RANGES.items():
        assert ok(getattr(cfg, name)), f"{name}={getattr(cfg, name)!r} was accepted"
    if cfg.mode in ("async", "quorum"):           # a parameter server: the star, async
        assert cfg.topology == "star"
    if cfg.mode != "sync":
        assert world_size >= 2
    if cfg.mode == "quorum":
        assert 0 <= cfg.quorum <= world_size - 1
    for rank, factor in parse_stragglers(cfg.straggler).items():
        assert 0 <= rank < world_size and math.isfinite(factor) and factor >= 1
    for rank in parse_faults(cfg.fail, world_size):
        assert 0 <= rank < world_size
    # the ranks that step envs: all but the servers, learners, predictor, replay ranks
    service = cfg.replay_ranks if cfg.gorila_replay == "service" else 0
    workers = world_size - {"sync": 0, "impala": cfg.learners, "ga3c": 2,
                            "apex": 1 + cfg.replay_ranks, "gorila": cfg.servers + service,
                            "async": cfg.servers}.get(cfg.mode, 1)
    assert workers >= 1
    assert cfg.total_steps >= workers * cfg.num_envs * cfg.rollout_steps * cfg.action_repeat


def type_ok(name: str, value) -> bool:
    kind = type(getattr(DEFAULTS, name))
    if kind is float:
        return type(value) in (float, int)
    if kind is list:
        return type(value) in (list, tuple)
    return type(value) is kind


def same(a, b) -> bool:
    """Equality in which NaN equals NaN (a config may hold target_return=nan)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


def one_line(err: ConfigError) -> str:
    message = str(err)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    assert "Traceback" not in message
    return message


def names_one_of(message: str, keys) -> bool:
    """The message names one of ``keys`` as a word (env_arg errors name the argument)."""
    for key in keys:
        text = str(key)
        if re.search(rf"(?<![\w]){re.escape(text)}(?![\w])", message) or \
                (text.isprintable() is False and repr(text) in message):
            return True
    return False


# -- configurations ---------------------------------------------------------------------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=config_dicts, world_size=st.integers(1, 9))
@example(data={1: 2, "lr": 0.1}, world_size=2)            # a key that is not a string
@example(data={"a\nb": 1}, world_size=2)                   # a key with a line break
@example(data={"value_coef": math.nan}, world_size=2)
@example(data={"wait_timeout_s": math.nan}, world_size=2)
@example(data={"hidden": [True, 4]}, world_size=2)
@example(data={"straggler": ["1:inf"]}, world_size=2)
def test_config_is_accepted_within_its_ranges_or_refused_naming_the_field(data, world_size):
    try:
        cfg = Config.from_dict(data, source="fuzz.yaml")
    except ConfigError as err:
        message = one_line(err)
        offending = [k for k in data if k not in FIELDS or not type_ok(k, data[k])]
        assert offending, f"refused a mapping of known fields of the right types: {message}"
        assert names_one_of(message, offending), message
        return
    assert all(k in FIELDS and type_ok(k, v) for k, v in data.items())
    with tempfile.TemporaryDirectory() as tmp:        # what a run saves, loaded back
        cfg.save(Path(tmp) / "config.yaml")
        back = Config.from_yaml(Path(tmp) / "config.yaml")
    for name in FIELDS:
        assert same(getattr(back, name), getattr(cfg, name)), name
    try:
        cfg.validate(world_size)
    except ConfigError as err:
        message = one_line(err)
        set_by_user = [k for k in data if getattr(cfg, k) != getattr(DEFAULTS, k)
                       or k in ("mode", "topology")]
        env_keys = [str(s).partition("=")[0].strip() for s in cfg.env_arg]
        assert names_one_of(message, [*set_by_user, *env_keys]), (message, data)
        return
    check_documented_ranges(cfg, world_size)


flags = st.sampled_from(sorted(
    "--" + f.name.replace("_", "-") for f in fields(Config) if f.name != "resume"
) + ["--no-layer-norm", "--layer-norm", "--bogus", "--lr", "--num-envs", "--straggler"])
flag_values = st.sampled_from(["0", "1", "-1", "2.5", "nan", "inf", "-inf", "1e400", "ring",
                               "star", "async", "quorum", "1:2", "1@2:nan", "x", "", "8", "64"])


@settings(max_examples=200, deadline=None)
@given(argv=st.lists(st.tuples(flags, st.lists(flag_values, max_size=2)), max_size=5),
       world_size=st.integers(1, 9))
@example(argv=[("--value-coef", ["nan"])], world_size=2)
@example(argv=[("--straggler", ["1:inf"])], world_size=2)
@example(argv=[("--env", ["Delay-v0"]), ("--env-arg", ["tail=!!float"])], world_size=2)
@example(argv=[("--env", ["Delay-v0"]), ("--env-arg", ["tail=" + "[" * 1100])], world_size=2)
def test_command_line_is_accepted_or_refused_in_one_line(argv, world_size):
    words = [w for flag, values in argv for w in (flag, *values)]
    try:
        cfg = parse_args(words)
        cfg.validate(world_size)
    except ConfigError as err:
        one_line(err)
        return
    check_documented_ranges(cfg, world_size)


# -- the YAML loader ----------------------------------------------------------------------------
yaml_lines = st.lists(st.one_of(
    st.text(max_size=30),
    st.builds("{}{}: {}".format, st.sampled_from(["", "  ", "\t", "- "]),
              st.sampled_from([*list(FIELDS)[:8], "x", "'q", "[", "?"]),
              st.sampled_from(["1", "[1, 2", "{a: 1", "'open", '"x', "&a 1", "*a", "!!int x",
                               "!!python/object:os.system", "|", ">", "%", "@", "`", "- 1",
                               ".nan", "1e3", "0x1F", "~", "", "\x00", "\ufeff"]))),
    max_size=8).map("\n".join)


def load_text(content) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exp.yaml"
        path.write_bytes(content if isinstance(content, bytes) else
                         content.encode("utf-8", "surrogatepass"))
        try:
            Config.from_yaml(path)
        except ConfigError as err:
            message = one_line(err)
            assert str(path) in message or "fuzz" in message or "exp.yaml" in message, message
            if "not valid YAML" in message:
                # YAML's line breaks: CR LF, CR, LF, NEL, LS, PS (its line numbers count them)
                text = (content if isinstance(content, str) else
                        content.decode("utf-8", "replace"))
                lines = len(re.split("\r\n|[\r\n\x85\u2028\u2029]", text))
                found = re.search(r"exp\.yaml line (\d+): not valid YAML", message)
                assert found, f"no line number: {message}"
                assert 1 <= int(found.group(1)) <= lines + 1, message


@settings(max_examples=300, deadline=None)
@given(content=st.one_of(yaml_lines, st.text(max_size=200), st.binary(max_size=60)))
@example(content="[" * 1100)                             # nested deeper than Python recurses
@example(content="seed: 1\n\x00\n")                       # a character YAML does not allow
@example(content=b"seed: 1\nlr: \xff\xfe\n")               # not UTF-8
@example(content="1: a\nseed: 2\n")                       # a key that is not a string
def test_any_file_loads_or_is_refused_naming_the_line(content):
    load_text(content)
