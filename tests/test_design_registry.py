"""The design registry: what follows from each row (roles, experience ranks, deciding
ranks) is what the designs do, and the CLI and checks read it."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys

import pytest

from mpirl import registry
from mpirl.config import Config
from mpirl.resilience.schedule import REPLAYABLE, deciding_ranks
from mpirl.telemetry.schema import ACTOR_LEARNER_MODES

#: the wiring each design module builds (written out once here, as the modules read)
SERVING = {"sync": lambda c: 0, "sync-replay": lambda c: 0, "async": lambda c: c.servers,
           "quorum": lambda c: 1,
           "impala": lambda c: c.learners, "seed": lambda c: 1, "ga3c": lambda c: 2,
           "apex": lambda c: 1 + c.replay_ranks,
           "gorila": lambda c: c.servers + (c.replay_ranks if c.gorila_replay == "service"
                                            else 0)}
#: every mode with the options it takes varied (others at their defaults)
CONFIGS = [Config(mode=m, servers=s, learners=n, replay_ranks=r, gorila_replay=g)
           for m, s, n, r, g in itertools.product(registry.MODES, (1, 2), (1, 2), (1, 3),
                                                  ("local", "service"))
           if (s == 1 or "servers" in registry.design(m).options)
           and (n == 1 or "learners" in registry.design(m).options)]


def test_every_mode_has_a_row_in_order():
    assert set(SERVING) == set(registry.MODES) == set(registry.DESIGNS)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.mode}-s{c.servers}-l{c.learners}"
                         f"-r{c.replay_ranks}-{c.gorila_replay}")
def test_roles_place_the_serving_ranks_first_and_count_the_rest(cfg):
    design = registry.design(cfg.mode)
    serving = len(design.serving(cfg))
    assert serving == SERVING[cfg.mode](cfg)
    for size in range(serving + 1, serving + 5):
        roles = cfg.roles(size)
        assert len(roles) == size
        assert set(roles[serving:]) == {design.experience_role}
        assert cfg.experience_ranks(size) == size - serving
        assert all(role not in registry.EXPERIENCE_ROLES for role in roles[:serving])


def test_deciding_ranks_and_replayable_designs():
    deterministic = {"sync", "sync-replay"}
    assert not deterministic & set(REPLAYABLE)
    assert set(REPLAYABLE) == set(registry.MODES) - deterministic
    assert deciding_ranks(Config(mode="apex", replay_ranks=3), 8) == [0, 1, 2, 3]
    assert deciding_ranks(Config(mode="ga3c"), 5) == [1]
    assert deciding_ranks(Config(mode="gorila", servers=2), 6) == [0, 1]
    assert deciding_ranks(Config(mode="gorila", servers=2, gorila_replay="service"),
                          6) == list(range(6))
    assert deciding_ranks(Config(mode="impala", learners=2), 6) == [0, 1]


def test_derived_tables_come_from_the_rows():
    assert ACTOR_LEARNER_MODES == ("impala", "seed", "ga3c", "apex")
    assert registry.modes(learner="replay") == ("sync-replay", "apex", "gorila")
    assert registry.design("apex").summary_fields()[:2] == ("transitions_sent",
                                                           "transitions_inserted")
    with pytest.raises(KeyError, match="registered: sync, sync-replay, async"):
        registry.design("eventual")


def test_help_lists_every_design_by_its_row():
    text = subprocess.run([sys.executable, "-m", "mpirl.run", "--help"], capture_output=True,
                          text=True, check=True).stdout
    flat = " ".join(text.split())
    for design in registry.DESIGNS.values():
        assert f"{design.name} {' '.join(design.about.split())[:30]}" in flat
    # grouped by the config's field groups, every default printed once, none as None
    assert "design: what is compared" in text and "run files, progress and logs" in text
    options = re.split(r"\n  (?=--)", text)
    assert all(option.count("(default:") <= 1 for option in options)
    assert "(default: None)" not in flat
