"""analysis/notebooks: each runs top to bottom on a real tiny sweep and draws figures."""

from __future__ import annotations

import nbclient
import nbformat
import pytest

from conftest import ROOT


@pytest.mark.parametrize("notebook", ["scaling_curves", "run_timeline"])
def test_notebook_runs_top_to_bottom(tiny_sweep, notebook, monkeypatch):
    path = ROOT / "analysis" / "notebooks" / f"{notebook}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "notebooks are committed without outputs"
    monkeypatch.setenv("MPIRL_SWEEP", str(tiny_sweep))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nbclient.NotebookClient(nb, timeout=180, startup_timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert len(images) >= 2
