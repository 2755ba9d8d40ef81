"""The translate memory benchmark's smallest setting runs and reads the
child's peak memory and translation."""

import json

import keras
import pytest

from benchmarks import translate_memory


# Two processes load Keras and the recipe's model size.
@pytest.mark.slow
def test_translate_memory_smoke(tmp_path):
    backend = keras.backend.backend()
    path = tmp_path / "translate_memory.json"
    report = translate_memory.main(
        ["--smoke", "--backends", backend, "--imports", "--output", str(path)]
    )
    assert json.loads(path.read_text()) == report
    assert report["tokenizer_text"] == "generated"
    (run,) = report["runs"]
    assert run["backend"] == backend
    # A Python process with Keras and a backend takes well over 100 MB.
    assert 100 < run["peak_rss_mb"] < 64 * 1024
    assert run["output_words"] > 0
    assert isinstance(run["imports_tensorflow"], bool)
