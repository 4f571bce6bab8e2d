"""The deciding rank's book of the run, and the one stop rule.

Whichever rank decides when a run ends (a parameter server, shard 0, a learner, the
inference rank) keeps the same book: env steps so far, the episode window of the next
progress line, the recent mean returns of the ranks that judge ``--target-return``,
and whether the target was reached.  The run ends when the budget is spent, the target
is reached, or a stop was asked for (SIGTERM/SIGINT, or a peer's stop flag): written once,
in :meth:`Book.ends`.  When a design judges (at each progress line, each batch, each
request) is its own, as is who judges (every actor; a DQN design's greediest one).
"""

from __future__ import annotations

import numpy as np

from .common import reached_target


class Book:
    """Env steps, the progress window, the judges' recent means, the target, the end."""

    def __init__(self, cfg, judges: int) -> None:
        self.total_steps, self.target = cfg.total_steps, cfg.target_return
        self.judges = judges             # recent means a judgement needs, one per judge
        self.env_steps = 0
        self.window = [0.0, 0.0]         # episodes, return sum since the last progress line
        self.recent: dict[int, float] = {}   # judge -> its recent mean return
        #: actor -> its share of time waiting, as its last message said (the progress line)
        self.waits: dict[int, float] = {}
        self.solved = False

    def add(self, env_steps: int, episodes: float, return_sum: float) -> None:
        """Env steps taken and episodes finished (their count and return sum)."""
        self.env_steps += env_steps
        self.window[0] += episodes
        self.window[1] += return_sum

    def judge(self) -> bool:
        """Has ``--target-return`` been reached (by every judge's recent mean)?"""
        self.solved = self.solved or reached_target(self.target, list(self.recent.values()),
                                                    self.judges)
        return self.solved

    def ends(self, asked: bool = False) -> bool:
        """The stop rule: the budget is spent, the target reached, or a stop ``asked``."""
        return self.env_steps >= self.total_steps or self.solved or asked

    def report(self, progress, version: int, lags: list, comm_share: float | None = None,
               waiting: tuple[str, float] | None = None,
               actors_waiting: float | None = None) -> None:
        """One progress line (the mean of the last 100 ``lags``, policy lags or
        staleness, in its staleness column; the workers' ``comm_share``, or the
        reporting rank's own ``waiting`` (role, share) where it sees no one else's
        time), and the actors' mean waiting share: ``actors_waiting`` where the caller
        gathered it from several books, else the mean of :attr:`waits` where actors told
        theirs; a fresh window."""
        recent = lags[-100:]
        if actors_waiting is None and self.waits:
            actors_waiting = float(np.mean(list(self.waits.values())))
        progress.report(update=version, env_steps=self.env_steps, episodes=self.window[0],
                        return_sum=self.window[1], comm_share=comm_share, waiting=waiting,
                        actors_waiting=actors_waiting,
                        mean_staleness=float(np.mean(recent)) if recent else 0.0)
        self.window = [0.0, 0.0]
