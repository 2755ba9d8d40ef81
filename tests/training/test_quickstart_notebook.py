"""recipes/quickstart.ipynb runs top to bottom (with a small step count),
so that it never goes stale."""

import json
import os

from tests.conftest import MULTI30K, REPO_ROOT

NOTEBOOK = REPO_ROOT / "recipes" / "quickstart.ipynb"


def test_quickstart_notebook_runs(multi30k_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKSTART_DATA_DIR", str(MULTI30K))
    monkeypatch.setenv("QUICKSTART_OUTPUT", str(tmp_path / "translator"))
    monkeypatch.setenv("QUICKSTART_STEPS", "2")
    monkeypatch.setenv("QUICKSTART_VOCABULARY", "800")
    monkeypatch.setenv("QUICKSTART_TEST_SENTENCES", "6")
    with open(NOTEBOOK) as f:
        notebook = json.load(f)
    namespace = {"__name__": "__main__"}
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert len(cells) >= 6
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        exec(
            compile(source, f"{NOTEBOOK.name}[cell {index}]", "exec"), namespace
        )
    assert 0.0 <= namespace["result"].score <= 100.0
    assert len(namespace["result"].hypotheses) == 6
    assert "config.json" in os.listdir(tmp_path / "translator")
