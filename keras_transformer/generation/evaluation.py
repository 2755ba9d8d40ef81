"""BLEU evaluation of a `Translator` with sacreBLEU."""

import dataclasses

import sacrebleu


@dataclasses.dataclass
class BleuResult:
    """A corpus BLEU score and what is needed to report it.

    Attributes:
        score: corpus BLEU, 0 to 100.
        signature: sacreBLEU's signature of the settings (references,
            case, tokenization, smoothing, version), to quote with the
            score so that it can be compared.
        bleu: sacreBLEU's `BLEUScore` (n-gram precisions, brevity penalty).
        hypotheses: the translations, in the order of the sources.
    """

    score: float
    signature: str
    bleu: object
    hypotheses: list

    def __str__(self):
        return f"BLEU = {self.score:.2f} ({self.signature})"


def corpus_bleu(hypotheses, references, tokenize="13a", lowercase=False):
    """sacreBLEU corpus BLEU of hypotheses against one or more references.

    Args:
        hypotheses: a list of str.
        references: a list of str (one reference per hypothesis), or a
            list of such lists (several references).
        tokenize: sacreBLEU's tokenizer: ``"13a"`` (its default, as for
            WMT), ``"intl"``, ``"none"``, ...
        lowercase: case-insensitive BLEU.

    Returns:
        A `BleuResult`.
    """
    hypotheses = list(hypotheses)
    if references and isinstance(references[0], str):
        references = [references]
    references = [list(r) for r in references]
    for i, stream in enumerate(references):
        if len(stream) != len(hypotheses):
            raise ValueError(
                f"Reference set {i} has {len(stream)} sentences but there "
                f"are {len(hypotheses)} hypotheses; they must align line by "
                "line."
            )
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    bleu = metric.corpus_score(hypotheses, references)
    return BleuResult(
        score=float(bleu.score),
        signature=str(metric.get_signature()),
        bleu=bleu,
        hypotheses=hypotheses,
    )


def evaluate_bleu(
    translator,
    sources,
    references,
    tokenize="13a",
    lowercase=False,
    **settings,
):
    """Translates a test set and scores it with sacreBLEU.

    Args:
        translator: a `Translator`.
        sources: a list of source sentences.
        references: their reference translations: a list of str, or a
            list of lists of str for several references.
        tokenize, lowercase: sacreBLEU settings (see `corpus_bleu`).
        **settings: generation settings for `Translator.translate`, e.g.
            ``beam_size=4, length_penalty=0.6`` (the paper's).

    Returns:
        A `BleuResult`; ``str(result)`` reads like
        ``BLEU = 35.12 (nrefs:1|case:mixed|eff:no|tok:13a|...)``.
    """
    sources = list(sources)
    if references and isinstance(references[0], str):
        count = len(references)
    else:
        count = len(references[0]) if references else 0
    if count != len(sources):
        raise ValueError(
            f"There are {len(sources)} sources but {count} references; "
            "they must align line by line."
        )
    n = settings.setdefault("num_return_sequences", 1)
    if n != 1:
        raise ValueError(
            f"BLEU scores one translation per source; got "
            f"num_return_sequences={n}. Leave it at 1."
        )
    hypotheses = translator.translate(sources, **settings)
    return corpus_bleu(
        hypotheses, references, tokenize=tokenize, lowercase=lowercase
    )
