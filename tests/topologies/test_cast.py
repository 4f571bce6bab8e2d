"""The compression wrappers (topologies.cast) under a real mpiexec, and in a run."""

from __future__ import annotations

import pytest

from conftest import train_many
from mpirl.telemetry.read import load_run
from mpirun import run_mpi


@pytest.mark.parametrize("nranks", [2, 3])
def test_wrappers_halve_the_bytes_divide_first_and_keep_replicas_identical(nranks):
    result = run_mpi(nranks, ["tests/mpi/check_cast.py"], timeout_s=120, check=False)
    lines = result.output.splitlines()
    for case in ("every message carries half the bytes",
                 "fp16 divides before the cast: an average of 40000s does not overflow",
                 "a half buffer is refused and bcast sends parameters exactly",
                 "replicas identical; bf16 rounds more coarsely than fp16"):
        assert f"OK {case}" in lines, result.tail()
    assert result.returncode == 0, result.tail()


def test_a_compressed_run_sends_half_the_gradient_bytes(tmp_path):
    # both runs in one launch (one after another: a launch costs a torch import per rank);
    # replicas compared every update
    train_many(tmp_path, 2, {compress: ["--topology", "ring", "--compress", compress,
                                        "--checksum-every", "1", "--total-steps", "3000"]
                             for compress in ("none", "bf16")}, timeout_s=600)
    sent = {}
    for compress in ("none", "bf16"):
        run = load_run(tmp_path / compress)
        later = run.updates[run.updates["update"] > 1]        # past the start's bcast row
        sent[compress] = later["bytes_sent"].sum() / len(later)
        assert run.config["compress"] == compress
    assert sent["bf16"] == pytest.approx(sent["none"] / 2, rel=0.01), sent
