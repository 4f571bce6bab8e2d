"""Every file in experiments/ that users launch loads and validates: a run configuration
at the rank count its own launch line names (``mpirun -np N``), a sweep with every point
(each validated at its own rank count)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mpirl.config import parse_args
from mpirl.study import sweep

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
FILES = sorted(EXPERIMENTS.glob("*.yaml"))


def test_there_are_run_configurations_and_sweeps():
    kinds = {"grid" in yaml.safe_load(f.read_text()) for f in FILES}
    assert kinds == {True, False}


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_experiment_file_validates(path):
    text = path.read_text()
    if "grid" in yaml.safe_load(text):
        points = sweep.load(path).points
        assert points and all(p.ranks >= 1 for p in points)
        return
    launch = re.search(r"mpirun -np (\d+) python -m mpirl\.run --config experiments/"
                       + re.escape(path.name), text)
    assert launch, f"{path.name} names no launch line 'mpirun -np N python -m mpirl.run ...'"
    cfg = parse_args(["--config", str(path)])
    cfg.validate(world_size=int(launch.group(1)))
