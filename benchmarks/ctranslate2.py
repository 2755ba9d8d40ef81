"""OPUS-MT decoding speed against CTranslate2 and ``transformers``, on the
same Marian weights.

    python -m benchmarks.ctranslate2 [--rounds 3] [--sentences 32]
        [--threads 2] [--output FILE.json] [--smoke]
        [--profile CONTESTANT]

A random Marian model of the OPUS-MT size (`benchmarks.marian`'s
checkpoint: d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, swish,
58,101 ids, tied embeddings, SentencePiece models trained on Multi30k)
translates the first ``--sentences`` sentences of Multi30k test2016
with beam 4, batch 16 and at most 32 new tokens, tokenization and
detokenization included, by:

- ``ours``: `kt.Translator.from_pretrained` of the checkpoint on the
  Keras backend, float32; and int8 after ``Translator.quantize("int8")``
  where the translator has it;
- ``ctranslate2``: the checkpoint converted by CTranslate2's
  ``TransformersConverter`` and run by ``ctranslate2.Translator`` on the
  CPU (``intra_threads=--threads``), ``compute_type`` float32 and int8,
  tokenized by the checkpoint's SentencePiece models;
- ``transformers``: ``MarianMTModel.generate(num_beams=4)``, torch eager;
- ``ours_ctranslate2``: the translator of ``ours`` exported by
  ``Translator.export(format="ctranslate2")`` (this package's converter)
  and run by `CTranslate2Translator` (``compute_type`` float32 and int8,
  the same threads), tokenization, truncation and settings this
  package's: ``ctranslate2_float32`` and ``ctranslate2_int8`` are the
  same engine on CTranslate2's own conversion of the same weights, and
  ``vs_same_engine`` is the export's speed over theirs.

Each library batches as it does for its users (ours and CTranslate2 sort
the sentences by length, ``transformers`` takes them in order). The
contestants alternate in rounds after a warm-up call (compilation) in one
process; medians of sentences per second are reported with each one's
speed over CTranslate2 float32 (the median of the per-round ratios) and
how many translations equal CTranslate2 float32's. Weights are random,
so hypotheses run to the token limit: every contestant decodes about the
same number of steps.

``--profile ours_int8`` (or ``ours_float32``, ``transformers``) runs
one more translation of that contestant under ``torch.profiler`` after
the rounds, and reports the torch operations that took the most CPU
time, with their share of the call: where a torch contestant's time
goes (ours on the torch backend only).

``--smoke`` runs tiny sizes (`benchmarks.marian`'s ``smoke`` model, 8
sentences, batch 4, 8 new tokens) for one round and skips the
contestants whose packages are missing.
"""

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import tempfile

from benchmarks import _common, marian

BEAM_SIZE = 4
# The contestant the others are compared with.
REFERENCE = "ctranslate2_float32"
# The contestants whose work runs as torch operations, which
# ``--profile`` can see (ours on the torch backend).
PROFILED = ("ours_float32", "ours_int8", "transformers")
# The export's contestants and CTranslate2's own conversion they are
# compared with (``vs_same_engine``).
SAME_ENGINE = {
    "ours_ctranslate2_float32": "ctranslate2_float32",
    "ours_ctranslate2_int8": "ctranslate2_int8",
}
PROFILE_ROWS = 15


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The model and workload of a run."""

    config: str  # a `benchmarks.marian.CONFIGS` name
    sentences: int  # Multi30k test2016 sentences translated per round
    batch_size: int
    max_new_tokens: int


FULL = Sizes("opus", 32, 16, 32)
SMOKE = Sizes("smoke", 8, 4, 8)


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sentences", type=int, default=None, help="default 32 (smoke: 8)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None)
    parser.add_argument(
        "--profile",
        default=None,
        choices=PROFILED,
        help="one more call of this contestant under torch.profiler",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one round; skips contestants whose packages "
        "are missing",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "sentences"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name}={value} must be at least 1.")
    if args.threads < 0:
        parser.error(f"--threads={args.threads} must be >= 0 (0: default).")
    sizes = SMOKE if args.smoke else FULL
    if args.sentences is not None:
        sizes = dataclasses.replace(sizes, sentences=args.sentences)
    if args.smoke:
        args.rounds = 1
    return args, sizes


# --- the contestants: each a function translating the sentences


def _ours(directory, sentences, sizes, int8):
    """`Translator.translate` of the converted checkpoint; None (and a
    reason) for int8 where the translator cannot quantize."""
    import keras_transformer as kt

    if int8 and not hasattr(kt.Translator, "quantize"):
        return None, "kt.Translator has no quantize method"
    translator = kt.Translator.from_pretrained(
        directory, max_length=sizes.max_new_tokens, batch_size=sizes.batch_size
    )
    if int8:
        translator.quantize("int8")
    return lambda: translator.translate(sentences, verbose=False), None


def _convert_for_ctranslate2(directory, output):
    """The checkpoint in CTranslate2's format (float32 weights; int8 is
    chosen when loading); False where ctranslate2 is not installed."""
    try:
        import ctranslate2
    except ImportError:
        return False
    ctranslate2.converters.TransformersConverter(directory).convert(output)
    return True


def _ours_ctranslate2(directory, sentences, sizes, threads):
    """`CTranslate2Translator` of this package's export of the converted
    checkpoint, ``{name: translate}`` in float32 and int8."""
    import keras_transformer as kt
    from keras_transformer.ctranslate2_engine import CTranslate2Translator

    translator = kt.Translator.from_pretrained(
        directory, max_length=sizes.max_new_tokens, batch_size=sizes.batch_size
    )
    # CTranslate2's beam search stops when beam_size hypotheses have
    # finished: transformers' early_stopping=True.
    translator.generation_config = translator.generation_config.replace(
        early_stopping=True
    )
    exported = translator.export(
        os.path.join(directory, "ours_ctranslate2"), format="ctranslate2"
    )
    contestants = {}
    for compute_type in ("float32", "int8"):
        served = CTranslate2Translator(
            exported, compute_type=compute_type, intra_threads=threads
        )
        contestants[f"ours_ctranslate2_{compute_type}"] = functools.partial(
            served.translate, sentences, verbose=False
        )
    return contestants


def _ctranslate2(model, directory, sentences, sizes, compute_type, threads):
    """``ctranslate2.Translator.translate_batch`` with SentencePiece
    tokenization: source pieces and the end token in, target pieces out,
    joined as ``transformers``' ``batch_decode(skip_special_tokens=True)``
    joins them."""
    import ctranslate2
    import sentencepiece

    def processor(name):
        return sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(directory, name)
        )

    source, target = processor("source.spm"), processor("target.spm")
    translator = ctranslate2.Translator(
        model,
        device="cpu",
        compute_type=compute_type,
        intra_threads=threads,
        inter_threads=1,
    )
    specials = {"</s>", "<pad>", "<unk>"}

    def translate():
        pieces = [source.encode(s, out_type=str) + ["</s>"] for s in sentences]
        results = translator.translate_batch(
            pieces,
            max_batch_size=sizes.batch_size,
            beam_size=BEAM_SIZE,
            length_penalty=1.0,
            # The others' last new token is the end token that Marian's
            # generation settings force at the limit (`forced_eos`);
            # CTranslate2 forces none and stops at its limit without
            # one, so it gets one token fewer to give the same strings
            # (one decoding step fewer, which favours it slightly).
            max_decoding_length=sizes.max_new_tokens - 1,
        )
        return [
            target.decode_pieces(
                [p for p in result.hypotheses[0] if p not in specials]
            )
            .replace("\u2581", " ")
            .strip()
            for result in results
        ]

    return translate


def _contestants(directory, sentences, sizes, args):
    """``({name: translate}, {name: reason skipped})`` for the checkpoint
    in ``directory`` (written by `benchmarks.marian.write_checkpoint`)."""
    hf_model, hf_tokenizer = marian.write_checkpoint(
        directory, marian.CONFIGS[sizes.config]
    )
    contestants, skipped = {}, {}
    converted = os.path.join(directory, "ctranslate2")
    if _convert_for_ctranslate2(directory, converted):
        for compute_type in ("float32", "int8"):
            contestants[f"ctranslate2_{compute_type}"] = _ctranslate2(
                converted,
                directory,
                sentences,
                sizes,
                compute_type,
                args.threads,
            )
        contestants.update(
            _ours_ctranslate2(directory, sentences, sizes, args.threads)
        )
    elif args.smoke:
        reason = "ctranslate2 is not installed"
        skipped.update(
            {name: reason for name in (*SAME_ENGINE, *SAME_ENGINE.values())}
        )
    else:
        raise SystemExit(
            "ctranslate2 is not installed: pip install ctranslate2 (or "
            "pip install -e '.[bench]'), or run with --smoke to skip it."
        )
    for name, int8 in (("ours_float32", False), ("ours_int8", True)):
        translate, reason = _ours(directory, sentences, sizes, int8)
        if translate is None:
            skipped[name] = reason
        else:
            contestants[name] = translate
    contestants["transformers"] = marian.transformers_translate(
        hf_model,
        hf_tokenizer,
        sentences,
        sizes.batch_size,
        sizes.max_new_tokens,
    )
    return contestants, skipped


# --- the run


def _rows(contestants, skipped, seconds, translations, count):
    """One row per contestant: median speed, per-round seconds, the
    ratio to the reference and the translations equal to its."""
    speed = {
        name: [count / s for s in values] for name, values in seconds.items()
    }
    reference = translations.get(REFERENCE)
    rows = []
    for name in contestants:
        row = {
            "contestant": name,
            "sentences_per_s": round(statistics.median(speed[name]), 3),
            "seconds_per_round": [round(s, 3) for s in seconds[name]],
        }
        if reference is not None:
            ratio = _common.ratios(speed, name, REFERENCE)
            row["vs_ctranslate2_float32"] = round(ratio["median"], 3)
            row["same_as_ctranslate2_float32"] = sum(
                a == b
                for a, b in zip(translations[name], reference, strict=True)
            )
        if name in SAME_ENGINE:
            ratio = _common.ratios(speed, name, SAME_ENGINE[name])
            row["vs_same_engine"] = round(ratio["median"], 3)
        rows.append(row)
    rows += [{"contestant": n, "skipped": r} for n, r in skipped.items()]
    return rows


def main(argv=None):
    """Runs the benchmark; prints the table and returns the report."""
    args, sizes = _arguments(argv)
    _common.pin_threads(args.threads)
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

    import torch
    import transformers

    _common.pin_frameworks(args.threads)
    _check_profiled(args.profile)
    if args.threads:
        # transformers runs on torch whatever the Keras backend.
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    lines = (marian.MULTI30K / "test.en").read_text("utf-8").splitlines()
    sentences = lines[: sizes.sentences]
    with tempfile.TemporaryDirectory() as directory:
        contestants, skipped = _contestants(directory, sentences, sizes, args)
        for name, reason in skipped.items():
            print(f"skipped {name}: {reason}")
        # Warm-up: compiles our search, loads the others; the outputs.
        translations = {name: fn() for name, fn in contestants.items()}
        seconds = _common.interleaved(contestants, args.rounds, _common.timed)
        profile = None
        if args.profile in contestants:
            profile = _profile(contestants[args.profile])
    rows = _rows(contestants, skipped, seconds, translations, len(sentences))
    report = _report(args, sizes, rows, translations)
    if profile is not None:
        report["profile"] = {"contestant": args.profile, "operations": profile}
    _common.write_json(args.output, report)
    print(
        _common.table(
            rows,
            [
                ("contestant", "contestant"),
                ("sentences/s", "sentences_per_s"),
                ("vs ctranslate2 float32", "vs_ctranslate2_float32"),
                ("same translations", "same_as_ctranslate2_float32"),
                ("vs same engine", "vs_same_engine"),
                ("skipped", "skipped"),
            ],
        )
    )
    if profile is not None:
        print(f"\n{args.profile} under torch.profiler, by self CPU time:")
        print(
            _common.table(
                profile,
                [
                    ("operation", "operation"),
                    ("calls", "calls"),
                    ("self CPU ms", "self_cpu_ms"),
                    ("share", "share"),
                ],
            )
        )
    return report


def _check_profiled(name):
    """Refuses ``--profile ours_...`` on a backend other than torch, whose
    operations the profiler would not see."""
    import keras

    backend = keras.backend.backend()
    if name and name.startswith("ours") and backend != "torch":
        raise SystemExit(
            f"--profile {name} sees torch operations only, and the Keras "
            f"backend is {backend}: run it with KERAS_BACKEND=torch."
        )


def _profile(translate):
    """The `PROFILE_ROWS` torch operations that took the most CPU time in
    one call of ``translate`` (their own time, not their callees'), with
    their share of all the operations' time."""
    from torch import profiler

    with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as run:
        translate()
    events = sorted(
        run.key_averages(),
        key=lambda event: event.self_cpu_time_total,
        reverse=True,
    )
    total = sum(event.self_cpu_time_total for event in events)
    return [
        {
            "operation": event.key,
            "calls": event.count,
            "self_cpu_ms": round(event.self_cpu_time_total / 1e3, 1),
            "share": round(event.self_cpu_time_total / total, 3),
        }
        for event in events[:PROFILE_ROWS]
    ]


def _report(args, sizes, rows, translations):
    import keras

    return {
        "benchmark": "ctranslate2",
        "backend": keras.backend.backend(),
        "config": sizes.config,
        "model": marian.CONFIGS[sizes.config],
        "sentences": sizes.sentences,
        "batch_size": sizes.batch_size,
        "beam_size": BEAM_SIZE,
        "max_new_tokens": sizes.max_new_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "rows": rows,
        "translations": translations,
        "machine": _common.machine(),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
