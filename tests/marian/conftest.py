"""A small random Marian checkpoint built locally with ``transformers``:
tiny SentencePiece models trained on Multi30k lines, a ``vocab.json``
laid out like OPUS-MT's (``</s>`` 0, ``<unk>`` 1, pieces, ``<pad>`` last),
a ``MarianMTModel`` with scaled random weights saved as safetensors and as
``pytorch_model.bin``. No download."""

import io
import json
import os

import numpy as np
import pytest

# Source lengths of the test sentences stay under this, and generation
# stops at MAX_NEW_TOKENS, so every search compiles once per backend.
MAX_NEW_TOKENS = 14
NUM_SENTENCES = 8


def _train_spm(lines, vocabulary_size):
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocabulary_size,
        model_type="unigram",
        character_coverage=1.0,
        # Marian's spm models have <unk> only; the other ids are vocab.json's.
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    return model.getvalue()


def _pieces(proto):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(proto)
    return [processor.IdToPiece(i) for i in range(1, len(processor))]


def read_lines(directory, name, count, max_words=None):
    """The first ``count`` lines (of at most ``max_words`` words)."""
    lines = []
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        for line in f:
            if max_words is None or len(line.split()) <= max_words:
                lines.append(line.strip())
            if len(lines) == count:
                break
    return lines


def write_checkpoint(directory, multi30k_dir, seed=0, **config_overrides):
    """Writes a random Marian checkpoint to ``directory`` (safetensors)
    and ``directory + "_bin"`` (pytorch_model.bin); returns the
    ``transformers`` model and tokenizer."""
    import torch
    import transformers

    english = read_lines(multi30k_dir, "train.en", 1000)
    german = read_lines(multi30k_dir, "train.de", 1000)
    source_spm = _train_spm(english, 250)
    target_spm = _train_spm(german, 250)
    pieces = ["</s>", "<unk>"]
    for piece in _pieces(source_spm) + _pieces(target_spm):
        if piece not in pieces:
            pieces.append(piece)
    pieces.append("<pad>")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "source.spm"), "wb") as f:
        f.write(source_spm)
    with open(os.path.join(directory, "target.spm"), "wb") as f:
        f.write(target_spm)
    with open(os.path.join(directory, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    pad = vocab["<pad>"]
    options = dict(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        dropout=0.1,
    )
    options.update(config_overrides)
    config = transformers.MarianConfig(**options)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    # Random models are nearly uniform and, with tied embeddings, copy
    # their input token. Larger weights, random LayerNorm scales and a
    # weak cross-attention give peaked distributions that depend on the
    # prefix, so that beam search differs from greedy search; the end
    # token gets a logit bias so that some hypotheses end early.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:
                continue
            if name.endswith("weight") and parameter.dim() == 2:
                std = 0.1 if "encoder_attn.out_proj" in name else 0.2
                parameter.normal_(0.0, std, generator=generator)
            elif "layer_norm.weight" in name:
                parameter.normal_(0.0, 1.0, generator=generator)
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.1, generator=generator)
        bias = torch.randn(model.final_logits_bias.shape, generator=generator)
        bias[0, 0] = 3.5
        model.final_logits_bias.copy_(bias)
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 4
    model.generation_config.max_length = 512
    model.generation_config.renormalize_logits = True
    model.save_pretrained(directory)
    tokenizer = transformers.MarianTokenizer(
        os.path.join(directory, "source.spm"),
        os.path.join(directory, "target.spm"),
        os.path.join(directory, "vocab.json"),
    )
    tokenizer.save_pretrained(directory)
    # transformers 5 saves safetensors only; a .bin checkpoint (most
    # OPUS-MT repositories have one) is a pickled state dict.
    bin_directory = f"{directory}_bin"
    os.makedirs(bin_directory, exist_ok=True)
    for name in os.listdir(directory):
        if name != "model.safetensors":
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            with open(os.path.join(bin_directory, name), "wb") as f:
                f.write(data)
    torch.save(
        model.state_dict(), os.path.join(bin_directory, "pytorch_model.bin")
    )
    return model, tokenizer


@pytest.fixture(scope="module")
def marian_checkpoint(tmp_path_factory):
    from tests.conftest import MULTI30K

    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    pytest.importorskip("transformers")
    directory = str(tmp_path_factory.mktemp("marian") / "opus-mt-tiny")
    model, tokenizer = write_checkpoint(directory, MULTI30K)
    sentences = read_lines(MULTI30K, "test.en", NUM_SENTENCES, max_words=7)
    return {
        "directory": directory,
        "model": model,
        "tokenizer": tokenizer,
        "sentences": sentences,
    }


def mixed_batch(sentences):
    """A batch of the checkpoint's sentences with an empty one, one longer
    than the model takes, one with a language code and a lone newline."""
    return [
        sentences[0],
        "",
        " ".join(sentences * 3),
        f">>deu<< {sentences[1]}",
        sentences[2],
        "\n",
    ]


def hf_generate(checkpoint, **options):
    """``MarianMTModel.generate`` on the checkpoint's sentences: a list of
    generated id lists (start token, end token and padding removed)."""
    import torch

    tokenizer = checkpoint["tokenizer"]
    batch = tokenizer(
        checkpoint["sentences"], return_tensors="pt", padding=True
    )
    with torch.no_grad():
        output = checkpoint["model"].generate(
            **batch, max_new_tokens=MAX_NEW_TOKENS, **options
        )
    end = checkpoint["model"].config.eos_token_id
    results = []
    for row in output.numpy()[:, 1:]:
        ids = [int(t) for t in row]
        if end in ids:
            ids = ids[: ids.index(end)]
        results.append(ids)
    return results


def as_array(values):
    return np.asarray(values)
