"""Every notebook in notebooks/ executes top to bottom without an error (the notebooks assert their
own results against NumPy, so a wrong value fails here too)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the testing extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the testing extra")
pytest.importorskip("ipykernel", reason="ipykernel is in the testing extra")

def skip_without_fashion_mnist() -> None:
    """The training notebook reads Fashion-MNIST from a system package or a folder; without the files
    (and with no network to fetch them) it cannot run: skip, saying how to get them."""
    from funcgrad import datasets
    try:
        datasets.fashion_mnist(download=False)
    except datasets.DatasetNotFoundError as err:
        pytest.skip(f"needs Fashion-MNIST (apt-get install dataset-fashion-mnist, or $FUNCGRAD_DATA): "
                    f"{str(err).splitlines()[0]}")


NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 2, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    if any("fashion_mnist(" in cell.source for cell in notebook.cells if cell.cell_type == "code"):
        skip_without_fashion_mnist()
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, showing the failing cell and its traceback
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
