"""A learner's own prioritized replay, in its process (``--gorila-replay local``, and
every rank of ``sync-replay``): transitions inserted, batches sampled, priorities set,
the transition ledger's counts (:data:`mpirl.kit.ledger.TRANSITIONS`), and what a
checkpoint keeps of it."""

from __future__ import annotations

import json

import numpy as np

from ..config import Config
from ..config.replay import local_warm_up
from ..parts.replay import PrioritizedReplay
from ..parts.transitions import TransitionLayout, as_batch, fill
from ..resilience.checkpoint import as_arrays, as_tensors


class LocalMemory:
    """A learner's own prioritized replay: one of ``workers`` that share
    ``--learning-starts``, seeded by its ``rank``."""

    def __init__(self, cfg: Config, layout: TransitionLayout, rank: int, workers: int) -> None:
        self.cfg = cfg
        self.replay = PrioritizedReplay(cfg.replay_capacity, layout.transition,
                                        alpha=cfg.replay_alpha, eps=cfg.replay_eps)
        self.block = np.zeros(layout.block_size, dtype=layout.transition)
        self.sample = np.zeros(cfg.replay_batch, dtype=layout.transition)
        self.rng = np.random.default_rng(cfg.seed + 10000 * rank)
        self.warmup = local_warm_up(cfg, workers)
        self.slots: tuple = ()
        self.sent = self.prio_sent = 0
        self.channels: tuple = ()         # no traffic: the memory is in this process

    def insert(self, trans: dict, prios: np.ndarray, version: int, timer) -> int:
        n = fill(self.block, trans, prios, version)
        self.replay.add(self.block[:n], prios)
        self.sent += n
        return n

    def batch(self, beta: float, timer) -> dict | None:
        """A batch to learn from, or None while the replay is below its warm-up."""
        if len(self.replay) < self.warmup:
            return None
        idx, stamps, weights = self.replay.sample(self.cfg.replay_batch, self.rng, beta,
                                                  out=self.sample)
        self.slots = (idx, stamps)
        return as_batch(self.sample, weights)

    def priorities(self, td: np.ndarray, beta: float) -> None:
        self.replay.update_priorities(*self.slots, td)
        self.prio_sent += len(td)

    def size(self) -> int:
        return len(self.replay)

    def leave(self, timer) -> None:
        pass

    def counts(self) -> dict:
        r = self.replay
        return {"transitions_sent": self.sent, "transitions_inserted": r.inserted,
                "replay_stored": len(r), "replay_evicted": r.evicted,
                "transitions_sampled": r.sampled, "priority_sent": self.prio_sent,
                "priority_updates": r.updated, "priority_stale": r.stale_updates}

    # -- what a checkpoint keeps: Stateful (mpirl.resilience.checkpoint) --------------------
    PREFIX = "memory."

    def state(self) -> dict:
        """The replay's records, stamps, priorities and counts (as tensors: the arrays are
        not copied), the sampling RNG and the ledger's counts, under ``memory.`` keys."""
        return {self.PREFIX + "replay": as_tensors(self.replay.state()),
                self.PREFIX + "sent": self.sent, self.PREFIX + "prio_sent": self.prio_sent,
                self.PREFIX + "rng": json.dumps(self.rng.bit_generator.state)}

    def load_state(self, state: dict) -> None:
        self.replay.load_state(as_arrays(state[self.PREFIX + "replay"]))
        self.sent, self.prio_sent = state[self.PREFIX + "sent"], state[self.PREFIX + "prio_sent"]
        self.rng.bit_generator.state = json.loads(state[self.PREFIX + "rng"])
