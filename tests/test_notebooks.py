"""Every notebook under notebooks/ runs top to bottom (GPU notebooks only with CUDA)."""
from pathlib import Path

import pytest

# The dev extra installs both; the GPU machines' image lacks them, where this file is skipped.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def _needs_gpu(nb) -> bool:
    return bool(nb.metadata.get("hlotk", {}).get("needs_gpu"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    if _needs_gpu(nb):
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("notebook needs a CUDA device")
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_there_is_at_least_one_notebook():
    assert any(p.name == "01_visualize_passes.ipynb" for p in NOTEBOOKS)
