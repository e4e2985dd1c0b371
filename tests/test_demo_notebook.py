"""The demo notebook, executed as nbconvert/GitHub see it: widget state stored, static figures."""

import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.read(ROOT / "labs" / "demo_dashboard.ipynb", as_version=4)
    # the notebook is stored clean: no outputs, no execution counts
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    workdir = tmp_path_factory.mktemp("demo")
    client = NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(workdir)}})
    os.environ["CI"] = "true"
    client.execute()
    return nb


def test_runs_top_to_bottom_without_errors(executed):
    for cell in executed.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", out


def test_widget_state_is_stored_for_the_dashboards(executed):
    state = executed.metadata["widgets"][WIDGET_STATE]["state"]
    models = [m["model_name"] for m in state.values()]
    assert models.count("VBoxModel") >= 2 and "HTMLModel" in models
    html = " ".join(str(m["state"].get("value", "")) for m in state.values())
    assert "rank 0" in html and "rank 3" in html and "KiB" in html


def test_static_figures_follow_each_dashboard(executed):
    pngs = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})]
    assert len(pngs) == 2  # the fsdp dashboard and the comparison
    for out in pngs:  # in the widget's own output: a frontend without widgets shows the PNG
        assert "application/vnd.jupyter.widget-view+json" in out["data"]
    texts = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "the formula 16Ψ/N says" in texts
