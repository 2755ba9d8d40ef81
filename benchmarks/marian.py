"""OPUS-MT decoding speed: a converted Marian model in keras-transformer
against ``transformers``' ``MarianMTModel.generate`` on the same weights.

    python -m benchmarks.marian [--config opus|small|smoke] [--rounds 5]
        [--sentences 32] [--batch-size 16] [--max-new-tokens 32]
        [--threads N] [--output FILE.json]

A random ``MarianMTModel`` of the OPUS-MT size (``--config opus``: d_model
512, 6 + 6 layers, 8 heads, d_ff 2048, swish, vocabulary 58,101, tied
embeddings, as ``Helsinki-NLP/opus-mt-en-de``) is built with
``transformers`` and saved with tokenizer files (SentencePiece models
trained on Multi30k, ``vocab.json`` padded to the vocabulary size), then
converted with `kt.Translator.from_pretrained`. Both translate the first
``--sentences`` sentences of Multi30k test2016 with beam 4, length
penalty 1, the same batch size and at most ``--max-new-tokens`` tokens,
tokenization and detokenization included. ``transformers`` runs on torch
(eager, its default); keras-transformer on the Keras backend, compiled.

Weights are random (``transformers``' initialization), so hypotheses
rarely end before the limit: every sentence costs about the same number
of steps in both. Contestants alternate in rounds after a warm-up
(compilation) call; the median sentences per second is reported, with
the per-round speed-up. The outputs of the two are compared too.
"""

import argparse
import io
import json
import os
import pathlib
import statistics
import sys
import tempfile

from benchmarks import _common

MULTI30K = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MULTI30K = MULTI30K / "multi30k"
CONFIGS = {
    "opus": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        vocab_size=58101,
    ),
    "small": dict(
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        vocab_size=16000,
    ),
    "smoke": dict(
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        vocab_size=600,
    ),
}


def _lines(name, count):
    with open(MULTI30K / name, encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(count), f, strict=False)]


def _train_spm(lines, vocabulary_size):
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocabulary_size,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    return model.getvalue()


def write_checkpoint(directory, config):
    """A random Marian checkpoint of ``config`` with tokenizer files."""
    import sentencepiece
    import torch
    import transformers

    vocabulary_size = config["vocab_size"]
    spm_size = min(2000, vocabulary_size // 4)
    source = _train_spm(_lines("train.en", 5000), spm_size)
    target = _train_spm(_lines("train.de", 5000), spm_size)
    pieces = ["</s>", "<unk>"]
    seen = set(pieces)
    for proto in (source, target):
        processor = sentencepiece.SentencePieceProcessor()
        processor.LoadFromSerializedProto(proto)
        for i in range(1, len(processor)):
            piece = processor.IdToPiece(i)
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    # OPUS-MT vocabularies are larger; unused entries fill the rest.
    pieces += [f"<unused{i}>" for i in range(vocabulary_size - len(pieces) - 1)]
    pieces.append("<pad>")
    vocab = {piece: i for i, piece in enumerate(pieces)}
    os.makedirs(directory, exist_ok=True)
    for name, data in (("source.spm", source), ("target.spm", target)):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    pad = vocab["<pad>"]
    marian_config = transformers.MarianConfig(
        **config,
        max_position_embeddings=512,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(marian_config).eval()
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 4
    model.generation_config.max_length = 512
    model.save_pretrained(directory)
    tokenizer = transformers.MarianTokenizer(
        *(
            os.path.join(directory, name)
            for name in ("source.spm", "target.spm", "vocab.json")
        )
    )
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def transformers_translate(model, tokenizer, sentences, batch_size, new):
    """A function translating ``sentences`` with ``MarianMTModel.generate``
    (beam 4, at most ``new`` new tokens), ``batch_size`` at a time."""
    import torch

    def translate():
        outputs = []
        for begin in range(0, len(sentences), batch_size):
            batch = tokenizer(
                sentences[begin : begin + batch_size],
                return_tensors="pt",
                padding=True,
            )
            with torch.no_grad():
                ids = model.generate(**batch, num_beams=4, max_new_tokens=new)
            outputs += tokenizer.batch_decode(ids, skip_special_tokens=True)
        return outputs

    return translate


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="opus")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    _common.pin_threads(args.threads)

    import torch
    import transformers

    import keras_transformer as kt

    _common.pin_frameworks(args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    sentences = _lines("test.en", args.sentences)
    with tempfile.TemporaryDirectory() as directory:
        hf_model, hf_tokenizer = write_checkpoint(
            directory, CONFIGS[args.config]
        )
        translator = kt.Translator.from_pretrained(
            directory,
            max_length=args.max_new_tokens,
            batch_size=args.batch_size,
        )

    hf_translate = transformers_translate(
        hf_model, hf_tokenizer, sentences, args.batch_size, args.max_new_tokens
    )

    def ours_translate():
        return translator.translate(sentences, verbose=False)

    contestants = {"transformers": hf_translate, "ours": ours_translate}
    # Warm-up: compiles our search; also compares the outputs.
    hf_outputs = hf_translate()
    our_outputs = ours_translate()
    same = sum(a == b for a, b in zip(hf_outputs, our_outputs, strict=True))
    seconds = _common.interleaved(contestants, args.rounds, _common.timed)
    speed = {
        name: [len(sentences) / s for s in values]
        for name, values in seconds.items()
    }
    speedup = _common.ratios(speed, "ours", "transformers")
    rows = [
        {
            "contestant": name,
            "sentences_per_s": round(statistics.median(values), 3),
            "seconds_per_round": [round(s, 3) for s in seconds[name]],
        }
        for name, values in speed.items()
    ]
    report = {
        "benchmark": "marian",
        "config": args.config,
        "model": CONFIGS[args.config],
        "parameters": translator.model.count_params(),
        "sentences": len(sentences),
        "batch_size": args.batch_size,
        "beam_size": 4,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "identical_outputs": f"{same} of {len(sentences)}",
        "rows": rows,
        "ours_speedup": {
            "median": round(speedup["median"], 3),
            "per_round": [round(r, 3) for r in speedup["per_round"]],
        },
        "machine": _common.machine(),
    }
    _common.write_json(args.output, report)
    print(
        _common.table(
            rows,
            [("contestant", "contestant"), ("sentences/s", "sentences_per_s")],
        )
    )
    print(
        f"ours / transformers: {speedup['median']:.2f}x (median of "
        f"{args.rounds} rounds); identical outputs: {same} of "
        f"{len(sentences)}"
    )
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
