"""Every notebook in notebooks/ executes top to bottom without an error (the notebooks assert their
own results against NumPy, so a wrong value fails here too)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the testing extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the testing extra")
pytest.importorskip("ipykernel", reason="ipykernel is in the testing extra")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 2, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, showing the failing cell and its traceback
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
