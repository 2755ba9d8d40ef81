"""One checkpoint format: `Translator.save` and `push_to_hub` write
KerasHub presets, and KerasHub's task saves what `Translator` loads, from
a directory and from a Hub repository (the local Hub server, the real
`huggingface_hub` client)."""

import json

import keras_hub
import numpy as np
from huggingface_hub import HfApi

import keras_transformer as kt
from keras_transformer.kerashub import (
    TransformerBackbone,
    TransformerSeq2SeqLM,
    TransformerSeq2SeqLMPreprocessor,
    TransformerTokenizer,
)
from tests.hub.conftest import SENTENCES, TOKEN, USER


def _assert_same_weights(model, expected):
    weights, expected = model.get_weights(), expected.get_weights()
    assert len(weights) == len(expected)
    for actual, wanted in zip(weights, expected, strict=True):
        np.testing.assert_array_equal(actual, wanted)


def _task(translator, seed=None):
    """The translator as a KerasHub task; with ``seed``, new random
    weights of the same shapes."""
    backbone = TransformerBackbone.from_transformer(translator.model)
    if seed is not None:
        rng = np.random.default_rng(seed)
        backbone.set_weights(
            [rng.normal(0, 0.5, w.shape) for w in backbone.get_weights()]
        )
    tokenizer = TransformerTokenizer.from_subword_tokenizer(
        translator.tokenizer
    )
    return TransformerSeq2SeqLM(
        backbone,
        TransformerSeq2SeqLMPreprocessor(tokenizer),
        translator.generation_config,
    )


def test_seq2seqlm_loads_a_saved_translator(hub_translator, tmp_path):
    hub_translator.save(tmp_path / "translator")
    task = keras_hub.models.Seq2SeqLM.from_preset(str(tmp_path / "translator"))
    assert type(task) is TransformerSeq2SeqLM
    assert task.generation_config == hub_translator.generation_config
    _assert_same_weights(task.backbone, hub_translator.model)
    assert task.generate(SENTENCES) == hub_translator.translate(SENTENCES)
    # The task's own save_to_preset writes the files Translator.save wrote.
    task.save_to_preset(str(tmp_path / "task"))
    for name in ("task.json", "config.json", "preprocessor.json"):
        assert json.loads((tmp_path / "task" / name).read_text()) == (
            json.loads((tmp_path / "translator" / name).read_text())
        )


def test_translator_loads_a_task_preset(hub_translator, tmp_path):
    _task(hub_translator).save_to_preset(str(tmp_path / "task"))
    translator = kt.Translator.from_pretrained(tmp_path / "task")
    assert translator.generation_config == hub_translator.generation_config
    assert translator.tokenizer.proto == hub_translator.tokenizer.proto
    _assert_same_weights(translator.model, hub_translator.model)
    assert translator.translate(SENTENCES) == hub_translator.translate(
        SENTENCES
    )


def test_seq2seqlm_loads_a_pushed_translator(hub_translator):
    repo = f"{USER}/kerashub-pushed"
    hub_translator.push_to_hub(repo, token=TOKEN)
    task = keras_hub.models.Seq2SeqLM.from_preset(f"hf://{repo}")
    assert type(task) is TransformerSeq2SeqLM
    _assert_same_weights(task.backbone, hub_translator.model)
    assert task.generate(SENTENCES) == hub_translator.translate(SENTENCES)


def test_upload_preset_then_from_preset_at_a_revision(
    hub_translator, tmp_path, monkeypatch
):
    # keras_hub.upload_preset takes no token argument: the environment's.
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    repo = f"{USER}/kerashub-uploaded"
    first, second = _task(hub_translator), _task(hub_translator, seed=1)
    first.save_to_preset(str(tmp_path / "first"))
    keras_hub.upload_preset(f"hf://{repo}", str(tmp_path / "first"))
    revision = HfApi(token=TOKEN).model_info(repo).sha
    second.save_to_preset(str(tmp_path / "second"))
    keras_hub.upload_preset(f"hf://{repo}", str(tmp_path / "second"))
    assert HfApi(token=TOKEN).model_info(repo).sha != revision

    pinned = TransformerSeq2SeqLM.from_preset(f"hf://{repo}@{revision}")
    _assert_same_weights(pinned.backbone, first.backbone)
    latest = keras_hub.models.Seq2SeqLM.from_preset(f"hf://{repo}")
    _assert_same_weights(latest.backbone, second.backbone)
    translator = kt.Translator.from_pretrained(f"hf://{repo}@{revision}")
    _assert_same_weights(translator.model, first.backbone)
    assert translator.translate(SENTENCES) == pinned.generate(SENTENCES)
