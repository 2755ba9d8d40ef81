"""Draws the pictures of the docs: ``docs/attention.png`` and
``docs/training.png``.

With ``--model``, the attention of a saved translator (a training run's
directory). Without it, a tiny model is first trained for a few minutes
on the CPU to copy Multi30k's English sentences: a task it learns
quickly, whose cross-attention should find, for each output token, the
same token of the source.

    KERAS_BACKEND=jax python docs/make_pictures.py \\
        --data-dir ../shared/data/multi30k
"""

import argparse
import os

import keras

import keras_transformer as kt

HERE = os.path.dirname(os.path.abspath(__file__))
SENTENCE = "A little girl in a pink dress is climbing the stairs."


def train_copy_model(data_dir, run, steps, seed=0):
    source, _ = kt.data.load_dataset("multi30k", "train", data_dir)
    tokenizer = kt.data.train_tokenizer([source], vocabulary_size=1000)
    dataset = kt.data.translation_dataset(
        source,
        source,
        tokenizer,
        max_tokens=1024,
        shuffle=True,
        seed=seed,
        max_length=48,
        repeat=True,
    )
    keras.utils.set_random_seed(seed)
    model = kt.Transformer(
        vocabulary_size=tokenizer.vocabulary_size,
        num_encoder_layers=2,
        num_decoder_layers=2,
        hidden_dim=64,
        num_heads=4,
        intermediate_dim=256,
        dropout=0.1,
        max_sequence_length=64,
    )
    model.compile(
        optimizer=kt.training.transformer_optimizer(64, warmup_steps=300),
        loss=kt.training.LabelSmoothedCrossEntropy(0.1),
        metrics=[kt.training.MaskedAccuracy()],
    )
    from keras_transformer.training.callbacks import LearningRateLogger

    logs = os.path.join(run, "logs")
    os.makedirs(logs, exist_ok=True)
    model.fit(
        dataset,
        steps_per_epoch=steps // 10,
        epochs=10,
        callbacks=[
            LearningRateLogger(),
            keras.callbacks.CSVLogger(os.path.join(logs, "training.csv")),
        ],
        verbose=2,
    )
    translator = kt.Translator(model, tokenizer, method="greedy")
    translator.save(run)
    return translator


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a saved translator")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--run", default="runs/copy_attention")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--sentence", default=SENTENCE)
    parser.add_argument("--layer", type=int, default=-1)
    parser.add_argument("--dpi", type=int, default=72)
    args = parser.parse_args()

    if args.model:
        translator = kt.Translator.from_pretrained(args.model, method="greedy")
        run = args.model
    else:
        translator = train_copy_model(args.data_dir, args.run, args.steps)
        run = args.run
    attention = translator.attention(args.sentence)
    print("source:     ", attention.source)
    print("translation:", attention.translation)
    kt.plot_attention(
        attention,
        os.path.join(HERE, "attention.png"),
        layer=args.layer,
        dpi=args.dpi,
    )
    kt.plot_training(run, os.path.join(HERE, "training.png"), dpi=args.dpi)


if __name__ == "__main__":
    main()
