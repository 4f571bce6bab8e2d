"""The error-feedback wrappers (topologies.topk, topologies.powersgd) under a real mpiexec,
and in a run that is killed and resumed (the residuals are in the checkpoints)."""

from __future__ import annotations

import json

import pytest

from conftest import BATCH
from mpirun import run_mpi

SPECS = ("topk:0.1:ring", "topk:0.02:butterfly", "topk:0.05:rabenseifner",
         "powersgd:2:ring", "powersgd:1:tree", "powersgd:4:native")


@pytest.mark.parametrize("nranks", [2, 3, 5, 7])
def test_feedback_wrappers_lose_nothing_and_keep_replicas_identical(nranks):
    result = run_mpi(nranks, ["tests/mpi/check_feedback.py"], timeout_s=180, check=False)
    lines = result.output.splitlines()
    cases = [f"{spec}: replicas identical, nothing lost" for spec in SPECS]
    cases += ["bytes: the inner topology's for k, or for the P's and Q's",
              "powersgd without describe(); options kept"]
    for spec in ("topk:0.1:ring", "powersgd:2:butterfly"):
        cases += [f"{spec}: its state continues exactly, one per buffer; a wrong dtype refused",
                  f"{spec}: a NaN gradient does not stay in the residual"]
    for case in cases:
        assert f"OK {case}" in lines, result.tail()
    assert result.returncode == 0, result.tail()


@pytest.mark.parametrize("compress", ["topk:0.05", "powersgd:2"])
def test_a_killed_compressed_run_resumes_to_the_same_parameters(tmp_path, compress):
    """The residuals (and PowerSGD's Q's) are in every rank's checkpoint: without them
    the resumed run would send other gradients and end elsewhere."""
    run = ["-m", "mpirl.run", "--total-steps", "1536", *BATCH, "--checkpoint-every", "4",
           "--compress", compress, "--topology", "ring", "--run-dir", str(tmp_path)]
    run_mpi(2, [*run, "--run-name", "full"], timeout_s=180)
    killed = run_mpi(2, [*run, "--run-name", "cut", "--fail", "1@10"], timeout_s=180,
                     check=False)
    assert killed.returncode != 0
    run_mpi(2, ["-m", "mpirl.run", "--resume", str(tmp_path / "cut")], timeout_s=180)
    full, cut = (json.loads((tmp_path / name / "summary.json").read_text())
                 for name in ("full", "cut"))
    assert cut["param_digest"] == full["param_digest"]
    assert cut["updates"] == full["updates"] and full["updates"] > 10
