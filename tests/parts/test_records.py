"""The one kind of record head every message has: names in order, found by name."""

from __future__ import annotations

import pytest

from mpirl.kit.pushpull import PUSH_META
from mpirl.kit.shards import GORILA_META
from mpirl.parts.records import Fields
from mpirl.parts.transitions import BLOCK_META
from mpirl.parts.unroll import UNROLL_META


def test_a_name_is_its_position_and_the_fields_stay_a_tuple():
    head = Fields("version", "index", "count")
    assert head["version"] == 0 and head["count"] == 2 and head[1] == "index"
    assert tuple(head) == ("version", "index", "count") and len(head) == 3
    assert Fields(*head, "leave")["leave"] == 3
    with pytest.raises(KeyError, match="no field 'stop'; fields: version, index, count"):
        head["stop"]


def test_the_records_that_travel_keep_their_layout():
    # the byte layouts are the runs' own: a field's position is what every peer reads
    assert PUSH_META["env_steps"] == 0 and PUSH_META["stop"] == len(PUSH_META) - 1 == 7
    assert GORILA_META["leave"] == len(PUSH_META)
    assert UNROLL_META["version"] == 0 and UNROLL_META["busy_s"] == 9
    assert BLOCK_META["version"] == 7
