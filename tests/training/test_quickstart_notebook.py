"""recipes/quickstart.ipynb runs top to bottom (on a small corpus), so
that it never goes stale, and does what it says."""

import json
import os

from keras_transformer.kerashub import TransformerSeq2SeqLM
from tests.conftest import MULTI30K, REPO_ROOT

NOTEBOOK = REPO_ROOT / "recipes" / "quickstart.ipynb"


def test_quickstart_notebook_runs(multi30k_dir, tmp_path, monkeypatch):
    settings = {
        "DATA_DIR": str(MULTI30K),
        "PRESET": str(tmp_path / "preset"),
        # Few pairs: few batch shapes to compile, a few steps per epoch.
        "TRAIN_PAIRS": "200",
        "VALID_PAIRS": "64",
        "TEST_PAIRS": "6",
        "VOCABULARY": "800",
        "LAYERS": "1",
        "HIDDEN_DIM": "32",
        "EPOCHS": "8",
        "WARMUP_STEPS": "24",
    }
    for name, value in settings.items():
        monkeypatch.setenv(f"QUICKSTART_{name}", value)
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
    # KerasHub's loader gave this package's task, twice.
    assert type(namespace["task"]) is TransformerSeq2SeqLM
    assert type(namespace["reloaded"]) is TransformerSeq2SeqLM
    # A dozen steps from ln(800) = 6.7: well below the untrained loss.
    untrained, trained = namespace["untrained_loss"], namespace["trained_loss"]
    assert trained < untrained - 1.0, (untrained, trained)
    translations = namespace["translations"]
    assert len(translations) == 6
    assert all(isinstance(t, str) for t in translations)
    for preset in ("preset", "preset_trained"):
        assert {"config.json", "task.json", "model.weights.h5"} <= set(
            os.listdir(tmp_path / preset)
        )
