"""The small-message path (topologies.persistent) under a real mpiexec.

The registry checks (test_topologies) pass every small buffer three times as the same
array and compare the replayed call's bytes with the plain call's; these tests check
what the path decides: what it plans, what it keeps, what a replay counts, that a
replay still sees a message of the wrong length, and that no request outlives MPI.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import topologies
from mpirun import ROOT, run_mpi

SCRIPT = "tests/mpi/check_persistent.py"
PLANNED = [name for name in topologies.names() if topologies.get(name).persistent]


def test_the_point_to_point_topologies_plan_their_small_calls():
    assert {"tree", "butterfly", "ring", "rabenseifner"} <= set(PLANNED)
    assert "bcast" not in topologies.get("ring").persistent    # its chain uses Irecv


def test_make_install_built_the_c_replay_for_this_venvs_mpi():
    import _mpirl_replay  # noqa: F401  (topologies/build_replay.py, run by make install)

    from topologies import persistent
    assert persistent.NATIVE is not None, "the C replay is built for another MPI library"


@pytest.mark.parametrize("nranks,native", [(2, "1"), (3, "1"), (5, "1"), (2, "0"), (3, "0")])
def test_replays_match_plain_calls_and_plan_only_repeated_small_arrays(nranks, native):
    """In C (the default where built) and in Python (MPIRL_SMALL_PATH_NATIVE=0, and
    wherever the C replay is not built: the ULFM venv's Open MPI)."""
    result = run_mpi(nranks, [SCRIPT], timeout_s=120, check=False,
                     env={"MPIRL_SMALL_PATH_NATIVE": native})
    lines = result.output.splitlines()
    assert f"replayed in {'C' if native == '1' else 'Python'}" in lines, result.tail()
    for name in PLANNED:
        assert f"OK {name} replays" in lines, result.tail()
        assert f"OK {name} small_path modes" in lines, result.tail()
        assert f"OK {name} plans only repeated small arrays" in lines, result.tail()
    for spec in ("hierarchical:butterfly:1", "fp16:butterfly"):
        assert f"OK {spec} plans its inner calls" in lines, result.tail()
    assert "OK a replay's wait lets other threads run" in lines, result.tail()
    if nranks == 2:
        assert "OK a replay sees a message 1 element too long" in lines, result.tail()
        assert "OK a replay sees a message 1 element too short" in lines, result.tail()
    assert result.returncode == 0 and not any(line.startswith("FAIL") for line in lines), \
        result.tail()
    # every persistent request was freed before MPI_Finalize (MPICH warns otherwise)
    assert "freeing inactive persistent request" not in result.output, result.tail()


def test_the_size_limit_is_a_byte_count_or_a_clear_error():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPIRL_SMALL_PATH_BYTES": "64K"}
    build = ("import topologies\ntry:\n    topologies.get('ring')()\n"
             "except topologies.TopologyError as err:\n    print('refused:', err)")
    result = subprocess.run([sys.executable, "-c", build], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr      # importing is not refused
    assert "refused: MPIRL_SMALL_PATH_BYTES='64K'; allowed: a byte count >= 0" \
        in result.stdout, result.stdout + result.stderr
    # the runtime: one line, exit 2, before anything starts
    result = run_mpi(2, ["-m", "mpirl.run", "--env", "CartPole-v1", "--total-steps", "64"],
                     env={"MPIRL_SMALL_PATH_BYTES": "-1"}, timeout_s=60, check=False)
    assert result.returncode == 2, result.tail()
    assert "mpirl.run: error: MPIRL_SMALL_PATH_BYTES='-1'; allowed: a byte count >= 0" \
        in result.output, result.tail()
    assert "Traceback" not in result.output, result.tail()
    env["MPIRL_SMALL_PATH_BYTES"] = "0"
    result = subprocess.run([sys.executable, "-c", "from topologies import persistent; "
                             "print(persistent.MAX_BYTES)"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "0", result.stderr


def test_the_c_replay_switch_is_0_or_1_or_a_clear_error():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    show = ("import topologies\nfrom topologies import persistent\n"
            "try:\n    topologies.get('ring')()\n"
            "except topologies.TopologyError as err:\n    print('refused:', err)\n"
            "print('C' if persistent.NATIVE else 'Python')")
    for value, expected in (("0", "Python"), ("1", "C"), ("yes", "Python")):
        result = subprocess.run([sys.executable, "-c", show],
                                env={**env, "MPIRL_SMALL_PATH_NATIVE": value}, cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == expected, result.stdout + result.stderr
        refused = "refused: MPIRL_SMALL_PATH_NATIVE='yes'; allowed: 1" in result.stdout
        assert refused == (value == "yes"), result.stdout
