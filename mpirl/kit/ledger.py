"""One ledger for every design: each role hands over its counts by name, :func:`settle`
sums them over every rank and checks the equalities the design declares.

Which counts a design keeps, and which equalities must hold between their sums, is
written once here, by ledger (the ledgers of :mod:`mpirl.registry`):

* gradients: sent = applied + dropped;
* unrolls: sent = used + dropped;
* delivery: every actor joined every parameter broadcast its learner started
  (received = the learners' broadcasts x their actors);
* requests: sent = answered + dropped, and every answer reached its actor
  (actions received = answered);
* transitions: the actors' sent = the replays' inserted = stored + evicted; priorities
  sent = applied + stale (their slot was overwritten since); no sampled slot was empty.

A violated equality raises :class:`mpirl.errors.AccountingError` with every term's sum.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from mpi4py import MPI

from ..errors import AccountingError


@dataclass(frozen=True)
class Balance:
    """``total == sum(parts)`` over the run (``parts`` empty: ``total == 0``)."""

    total: str
    parts: tuple[str, ...]
    what: str                       # what the equality says, for the error

    def names(self) -> tuple[str, ...]:
        return (self.total, *self.parts)

    def check(self, sums: dict[str, float]) -> None:
        if sums[self.total] != sum(sums[p] for p in self.parts):
            terms = " + ".join(f"{p} {sums[p]:.0f}" for p in self.parts) or "0"
            raise AccountingError(f"{self.what}: {self.total} {sums[self.total]:.0f} != "
                                  f"{terms}")


#: the equalities of each ledger
GRADIENTS = (Balance("gradients_sent", ("gradients_applied", "gradients_dropped"),
                     "every gradient a worker sent is applied or dropped"),)
UNROLLS = (Balance("unrolls_sent", ("unrolls_used", "unrolls_dropped"),
                   "every unroll sent is used or dropped"),)
DELIVERY = (Balance("broadcasts_received", ("broadcast_copies",),
                    "every actor joined every broadcast of its learner"),)
REQUESTS = (Balance("requests_sent", ("requests_answered", "requests_dropped"),
                    "every request is answered or dropped"),
            Balance("actions_received", ("requests_answered",),
                    "every answer reaches its actor"))
TRANSITIONS = (Balance("transitions_sent", ("transitions_inserted",),
                       "every transition an actor sent is inserted"),
               Balance("transitions_inserted", ("replay_stored", "replay_evicted"),
                       "every transition inserted is stored or evicted"),
               Balance("priority_sent", ("priority_updates", "priority_stale"),
                       "every priority sent is applied or stale"),
               Balance("invalid_samples", (), "no sampled slot held no transition"))


def settle(comm: MPI.Comm, counts: dict[str, float], invariants: tuple[Balance, ...],
           extra: tuple[str, ...] = ()) -> dict[str, float]:
    """Every count of ``invariants`` and ``extra``, summed over the ranks of ``comm``
    (collective: one Allreduce; a name this rank does not give counts 0 here), checked
    against every invariant; the sums, by name, on every rank."""
    names = sorted({n for balance in invariants for n in balance.names()} | set(extra))
    unknown = set(counts) - set(names)
    if unknown:
        raise ValueError(f"counts {sorted(unknown)} are in no ledger being settled")
    sums = np.asarray([counts.get(n, 0) for n in names], dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    totals = dict(zip(names, sums.tolist(), strict=True))
    for balance in invariants:
        balance.check(totals)
    return totals


def count_in_order(taken: dict, sender: int, said: float, role: str, thing: str,
                   taker: str) -> None:
    """Count one more ``thing`` taken from ``sender``, which numbers its own (``said``
    travels with it): the two counts must agree, else nothing can be accounted for."""
    taken[sender] += 1
    if int(said) != taken[sender]:
        raise AccountingError(f"{role} {sender} says this is its {thing} {int(said)}, but "
                              f"it is the {taken[sender]}th {taker} took")


def record(summary, totals: dict[str, float]) -> None:
    """Every total whose name is a field of ``summary`` (a count), as an int."""
    names = {f.name for f in fields(summary)}
    for name, value in totals.items():
        if name in names:
            setattr(summary, name, int(value))
