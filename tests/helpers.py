"""Shared test helpers."""

import json

import numpy as np
from keras import ops

import keras_transformer as kt


def tiny_model(**kwargs):
    config = dict(
        vocabulary_size=53,
        num_encoder_layers=2,
        num_decoder_layers=2,
        hidden_dim=32,
        num_heads=4,
        intermediate_dim=64,
        dropout=0.0,
        max_sequence_length=64,
    )
    config.update(kwargs)
    return kt.Transformer(**config)


def random_batch(rng, batch=3, source_length=9, target_length=6, vocab=53):
    """A batch whose sources and targets have different lengths and some
    padding (never a whole row of it)."""
    source_lengths = rng.integers(1, source_length + 1, size=batch)
    target_lengths = rng.integers(1, target_length + 1, size=batch)
    source_lengths[0] = source_length
    target_lengths[-1] = target_length

    def ids_and_mask(lengths, length):
        mask = (np.arange(length)[None, :] < lengths[:, None]).astype("int32")
        ids = rng.integers(4, vocab, size=(batch, length)) * mask
        return ids.astype("int32"), mask

    source, source_mask = ids_and_mask(source_lengths, source_length)
    target, target_mask = ids_and_mask(target_lengths, target_length)
    return {
        "encoder_token_ids": source,
        "encoder_padding_mask": source_mask,
        "decoder_token_ids": target,
        "decoder_padding_mask": target_mask,
    }


def to_numpy(x):
    return ops.convert_to_numpy(x)


# The model of a test's recipe run: one layer each side, width 32.
TINY_RECIPE_MODEL = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 32,
    "num_heads": 2,
    "intermediate_dim": 64,
    "dropout": 0.1,
}

# The tiny model with four heads, which a model-parallel layout splits,
# and no dropout, so that runs on different devices compare.
TINY_PARALLEL_MODEL = {**TINY_RECIPE_MODEL, "num_heads": 4, "dropout": 0.0}


def tiny_recipe_settings(**overrides):
    """Settings of a Multi30k recipe run small enough for a test: the tiny
    model, a 600-piece vocabulary, 512-token batches, two-step epochs that
    checkpoint every step and average the last two, no validation BLEU,
    and validation on two batches (each validation batch shape is one
    more compilation). ``overrides`` replace or add settings."""
    settings = {
        "steps_per_epoch": 2,
        "checkpoint_every": 1,
        "average_last": 2,
        "vocabulary_size": 600,
        "max_tokens": 512,
        "bleu_subset": 0,
        "validation_batches": 2,
        "model": TINY_RECIPE_MODEL,
    }
    settings.update(overrides)
    return settings


def set_arguments(settings):
    """``--set KEY=VALUE`` arguments of `keras-transformer train` for a
    dict of recipe settings (values as JSON)."""
    return [
        argument
        for key, value in settings.items()
        for argument in ("--set", f"{key}={json.dumps(value)}")
    ]


def save_version_1(translator, directory):
    """Writes ``translator`` in the layout that `Translator.save` wrote
    before it wrote KerasHub presets (format version 1), to show that such
    directories still load."""
    import os

    os.makedirs(directory, exist_ok=True)
    config = {
        "format_version": 1,
        "keras_transformer_version": "0.1.0",
        "model_class": "Transformer",
        "model_config": translator.model.get_config(),
    }
    if translator.quantization_mode is not None:
        config["quantization"] = translator.quantization_mode
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    translator.model.save_weights(os.path.join(directory, "model.weights.h5"))
    translator.tokenizer.save(os.path.join(directory, "tokenizer"))
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump(translator.generation_config.to_dict(), f)


# Lower-case pieces of the lines that TensorFlow, absl, oneDNN, CUDA and
# tensorflow-text's copy of SentencePiece write to standard error: a
# command prints none of them unless --verbose.
LIBRARY_NOISE = (
    "tensorflow",
    "absl",
    "onednn",
    "cuda",
    "cuinit",
    "cudart",
    "precompiled_charsmap",
    "normalizer.cc",
)


def noisy_lines(text, *own_paths):
    """The lines of a command's output that hold `LIBRARY_NOISE`, once
    the command's own paths are taken out (a temporary folder may be
    named after a backend)."""
    for path in own_paths:
        text = text.replace(str(path), "<path>")
    return [
        line
        for line in text.splitlines()
        if any(noise in line.lower() for noise in LIBRARY_NOISE)
    ]
