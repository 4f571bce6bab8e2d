"""analysis.plot: the figures command on a real tiny sweep and benchmark file."""

from __future__ import annotations

import os
import subprocess
import sys

import matplotlib.image

from conftest import ROOT, TINY_ASYNC as ASYNC, TINY_SYNC_2R as SYNC_2R


def test_plot_command_writes_every_figure(tiny_sweep, bench_file, tmp_path):
    out = tmp_path / "figs"
    result = subprocess.run([sys.executable, "-m", "analysis.plot", str(tiny_sweep),
                             str(bench_file), "-o", str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    names = ["scaling", "breakdown", "staleness", "learning", "losses", "latency", "sim_steps",
             f"timeline-{SYNC_2R}", f"timeline-{ASYNC}"]
    for name in names:
        for fmt in ("png", "pdf"):
            path = out / f"{name}.{fmt}"
            assert path.is_file() and path.stat().st_size > 5000, path
        image = matplotlib.image.imread(out / f"{name}.png")
        assert image.shape[0] > 300 and image.shape[1] > 500
        assert image[..., :3].std() > 0.05          # not a blank canvas
    assert "skipped" not in result.stdout
    assert (out / "runs.csv").read_text().count("\n") == 6


def test_plot_command_rejects_a_missing_path(tmp_path):
    result = subprocess.run([sys.executable, "-m", "analysis.plot", str(tmp_path / "nope"),
                             "-o", str(tmp_path / "o")], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and "no such file or directory" in result.stderr
