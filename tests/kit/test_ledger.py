"""The one ledger: named counts summed over ranks and checked, in one process (a real
communicator of one rank); every design settles through it under mpiexec in
tests/designs/."""

from __future__ import annotations

import math
import re

import pytest
from mpi4py import MPI

from mpirl.errors import AccountingError
from mpirl.kit import ledger
from mpirl.kit.common import Summary


def test_settle_sums_by_name_and_counts_missing_names_as_zero():
    totals = ledger.settle(MPI.COMM_SELF, {"unrolls_sent": 5, "unrolls_used": 3,
                                           "unrolls_dropped": 2}, ledger.UNROLLS,
                           extra=("bytes_sent",))
    assert totals == {"unrolls_sent": 5.0, "unrolls_used": 3.0, "unrolls_dropped": 2.0,
                      "bytes_sent": 0.0}


@pytest.mark.parametrize("counts, fragment", [
    ({"gradients_sent": 4, "gradients_applied": 2, "gradients_dropped": 1},
     "gradients_sent 4 != gradients_applied 2 + gradients_dropped 1"),
    ({"requests_sent": 2, "requests_answered": 2, "actions_received": 1},
     "actions_received 1 != requests_answered 2"),
    ({"transitions_sent": 3, "transitions_inserted": 3, "replay_stored": 3,
      "invalid_samples": 1}, "invalid_samples 1 != 0"),
])
def test_a_violated_equality_names_every_term(counts, fragment):
    invariants = ledger.GRADIENTS + ledger.REQUESTS + ledger.TRANSITIONS
    with pytest.raises(AccountingError, match=re.escape(fragment)):
        ledger.settle(MPI.COMM_SELF, counts, invariants)


def test_a_count_in_no_ledger_is_refused():
    with pytest.raises(ValueError, match="unrolls_sent"):
        ledger.settle(MPI.COMM_SELF, {"unrolls_sent": 1}, ledger.GRADIENTS)


def test_record_fills_only_the_summary_fields():
    summary = Summary(mode="apex", topology="butterfly", ranks=1)
    ledger.record(summary, {"transitions_sent": 7.0, "replay_stored": 7.0, "env_steps": 64.0})
    assert (summary.transitions_sent, summary.env_steps) == (7, 64)
    assert isinstance(summary.env_steps, int) and not hasattr(summary, "replay_stored")
    assert math.isnan(summary.mean_policy_lag)


def test_a_message_out_of_its_senders_order_is_refused():
    taken = {3: 0}
    ledger.count_in_order(taken, 3, 1.0, "actor", "block", "this replay")
    with pytest.raises(AccountingError, match="actor 3 says this is its block 3, but it is "
                                              "the 2th this replay took"):
        ledger.count_in_order(taken, 3, 3.0, "actor", "block", "this replay")
