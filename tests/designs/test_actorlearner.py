"""The actor-learner designs' shared parts in one process: the learner's unroll queue
(policy-lag bound, accounting), the inference batcher's sizes and apex's reply way."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest

from mpirl.config import Config
from mpirl.kit.actorlearner import UnrollQueue, lag_stats, reply_progress
from mpirl.kit.inference import Batcher
from mpirl.parts.unroll import UNROLL_META, UnrollLayout

LAYOUT = UnrollLayout(2, 1, gymnasium.spaces.Box(-1, 1, (2,)), gymnasium.spaces.Discrete(2))


def unroll(version):
    record = LAYOUT.empty()
    record[0]["meta"][UNROLL_META["version"]] = version
    return record


def test_the_queue_hands_out_batches_oldest_first_and_records_their_lag():
    q = UnrollQueue()
    for v in (0, 1, 1):
        q.add(unroll(v), version=1)
    assert q.take(4, version=1) == []            # not enough yet: nothing taken
    got = q.take(2, version=3)
    assert [int(r[0]["meta"][UNROLL_META["version"]]) for r in got] == [0, 1]
    assert q.lags == [3, 2] and q.used == 2 and len(q) == 1
    q.drop_rest()
    assert q.received == q.used + q.dropped == 3


def test_the_lag_bound_drops_old_unrolls_on_arrival_and_while_they_wait():
    q = UnrollQueue(max_lag=2)
    q.add(unroll(0), version=3)                 # 3 updates old on arrival: dropped
    q.add(unroll(2), version=3)
    q.add(unroll(3), version=3)
    assert q.dropped == 1 and len(q) == 2
    assert q.take(2, version=5) == []           # the one of version 2 got too old waiting
    assert q.dropped == 2 and len(q) == 1
    assert q.received == q.used + q.dropped + len(q)


def test_lag_stats():
    assert lag_stats([1, 1, 2, 6]) == (2.5, pytest.approx(np.percentile([1, 1, 2, 6], 95)))
    assert all(np.isnan(x) for x in lag_stats([]))


@pytest.mark.parametrize("mode, policy, batch, envs, actors, requests", [
    ("seed", "auto", 0, 4, 6, 3),        # fixed, half the actors' envs
    ("seed", "fixed", 5, 4, 6, 2),       # rounded up to whole actors
    ("ga3c", "auto", 0, 4, 6, 6),        # drain: everyone at most
    ("ga3c", "drain", 8, 4, 6, 2),
])
def test_batch_sizes(mode, policy, batch, envs, actors, requests):
    cfg = Config(mode=mode, inference_policy=policy, inference_batch=batch, num_envs=envs)
    b = Batcher(cfg, actors)
    assert b.policy == ("fixed" if (mode, policy) in (("seed", "auto"), ("seed", "fixed"))
                        else "drain")
    assert b.requests == requests


@pytest.mark.parametrize("delivery, asked, way", [("broadcast", "auto", ""),
                                                  ("push", "thread", "thread"),
                                                  ("push", "calls", "calls")])
def test_the_reply_way_is_decided_without_mpi_where_the_flags_decide_it(delivery, asked, way):
    """Only ``auto`` with the push asks MPI where the learner's feeders are (a collective
    every rank makes): a broadcast's replies carry no parameters, and an explicit way is
    kept (the communicator is not touched: None here)."""
    cfg = SimpleNamespace(param_delivery=delivery, reply_progress=asked)
    assert reply_progress(cfg, None, range(1, 2)) == way


def test_a_learner_fed_by_its_actors_alone_moves_replies_in_its_calls():
    """impala's learner (no feeders but its actors): calls, with no MPI asked."""
    cfg = SimpleNamespace(param_delivery="push", reply_progress="auto")
    assert reply_progress(cfg, None, range(0)) == "calls"
