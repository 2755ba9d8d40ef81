"""What every translator shares: `BaseTranslator` turns sentences into
batches of subword ids and `Hypothesis` lists back into results; its
subclasses decode the batches (`Translator` with this package's search,
`keras_transformer.ctranslate2_engine.CTranslate2Translator` with a
CTranslate2 export)."""

import dataclasses
import warnings

import keras

from keras_transformer import marian


@dataclasses.dataclass
class Hypothesis:
    """One translation with its scores (see `SearchResult`)."""

    text: str
    token_ids: list
    score: float
    log_prob: float


class BaseTranslator:
    """What every translator shares: checking sentences, tokenizing them
    with the model's length limit, sorting them by length, batching and
    progress; subclasses decode one batch (`_translate_batch`).

    Subclasses set ``tokenizer``, ``generation_config`` (a
    `GenerationConfig`) and ``max_sequence_length``: `Translator` decodes
    with this package's `Generator`, and
    `keras_transformer.ctranslate2_engine.CTranslate2Translator` with a
    CTranslate2 export of the same model.
    """

    def _check_config(self, config):
        """Raises for settings this translator cannot decode with, before
        any work; every setting of a `GenerationConfig` by default."""

    def _translate_batch(self, token_lists, config):
        """The `Hypothesis` lists of a batch of tokenized sentences."""
        raise NotImplementedError

    # --- translation

    def translate(self, sentences, verbose="auto", **settings):
        """Translates a sentence or a list of sentences.

        Args:
            sentences: a str or a list (or tuple) of str.
            verbose: ``"auto"`` shows a progress bar when there is more
                than one batch; True or False force it on or off.
            **settings: overrides of the `GenerationConfig` for this call,
                e.g. ``beam_size=4, length_penalty=0.6``.

        Returns:
            A str for a str; a list of str for a list. With
            ``num_return_sequences=n > 1``, each str becomes a list of
            the n best (or sampled) translations.
        """
        results = self.translate_with_scores(
            sentences, verbose=verbose, **settings
        )
        single = isinstance(sentences, str)
        results = [results] if single else results
        config = self.generation_config.replace(**settings)
        if config.num_return_sequences == 1:
            texts = [hypotheses[0].text for hypotheses in results]
        else:
            texts = [[h.text for h in hypotheses] for hypotheses in results]
        return texts[0] if single else texts

    def translate_with_scores(self, sentences, verbose="auto", **settings):
        """Like `translate`, but each sentence gives a list of
        `Hypothesis` (text, token ids, score, log-probability), best
        first (a single list for a single str)."""
        config = self.generation_config.replace(**settings)
        self._check_config(config)
        single = isinstance(sentences, str)
        sentences = self._check_sentences(sentences)
        n = config.num_return_sequences
        empty = [Hypothesis("", [], 0.0, 0.0)] * n
        results = [list(empty) for _ in sentences]
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        token_lists = self._tokenize([sentences[i] for i in todo], config)

        # Longest first: the slowest batch compiles and runs first, and
        # sentences of similar length share a batch.
        order = sorted(
            range(len(todo)), key=lambda j: len(token_lists[j]), reverse=True
        )
        show = verbose is True or (
            verbose == "auto" and len(order) > config.batch_size
        )
        progress = keras.utils.Progbar(len(order)) if show else None
        for begin in range(0, len(order), config.batch_size):
            chunk = order[begin : begin + config.batch_size]
            hypotheses = self._translate_batch(
                [token_lists[j] for j in chunk], config
            )
            for j, row in zip(chunk, hypotheses, strict=True):
                results[todo[j]] = row
            if progress is not None:
                progress.add(len(chunk))
        return results[0] if single else results

    def _check_sentences(self, sentences):
        if isinstance(sentences, str):
            return [sentences]
        if not isinstance(sentences, (list, tuple)):
            raise TypeError(
                "translate expects a str or a list of str; got "
                f"{type(sentences).__name__}."
            )
        for i, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                raise TypeError(
                    f"Sentence {i} is a {type(sentence).__name__}, not a "
                    f"str: {sentence!r}. Pass text (decode bytes first)."
                )
        return list(sentences)

    def _score_inputs(self, sentences, targets):
        """The subword ids of sentences and of their targets, checked to
        be as many (`score`'s inputs)."""
        sentences = self._check_sentences(sentences)
        targets = self._check_sentences(targets)
        if len(targets) != len(sentences):
            raise ValueError(
                f"There are {len(sentences)} sentences but {len(targets)} "
                "targets; pass one target per sentence."
            )
        config = self.generation_config
        return self._tokenize(sentences, config), self._tokenize(
            targets, config
        )

    def _tokenize(self, sentences, config):
        if not sentences:
            return []
        # `SubwordTokenizer.encode` gives its ids without TensorFlow.
        encode = getattr(self.tokenizer, "encode", self.tokenizer.tokenize)
        tokens = encode(list(sentences))
        tokens = tokens.to_list() if hasattr(tokens, "to_list") else tokens
        tokens = [[int(t) for t in row] for row in tokens]
        limit = self.max_sequence_length - 1  # one place for the end
        long = [i for i, row in enumerate(tokens) if len(row) > limit]
        if long:
            first = long[0]
            description = (
                f"{len(long)} sentence(s) have more than {limit} subword "
                f"tokens, the most the model takes (max_sequence_length="
                f"{self.max_sequence_length}, one place for the end "
                f"token); the first, {sentences[first][:60]!r}, has "
                f"{len(tokens[first])}."
            )
            if config.long_inputs == "error":
                raise ValueError(
                    f"{description} Split long sentences, or pass "
                    'long_inputs="truncate" to cut them.'
                )
            warnings.warn(
                f"{description} They are truncated to {limit} tokens.",
                stacklevel=4,
            )
            tokens = [row[:limit] for row in tokens]
        return tokens


def load_tokenizer_directory(directory):
    """The tokenizer saved in ``directory``: a `MarianTokenizer` or a
    `SubwordTokenizer` (``tokenizer.save(directory)``)."""
    if marian.is_marian_tokenizer_directory(directory):
        return marian.load_marian_tokenizer(directory)
    # Imported here: `generation` does not depend on `data` otherwise.
    # Neither this nor `encode` imports TensorFlow.
    from keras_transformer.data import load_tokenizer

    return load_tokenizer(directory)
