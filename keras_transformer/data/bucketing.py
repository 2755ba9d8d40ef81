"""Length buckets with a token budget, and the batches of each epoch.

Every batch is padded to one of a few fixed ``(batch_size, source_length,
target_length)`` shapes, so that JAX and XLA compile a handful of programs,
not one per batch. `learn_bucket_shapes` picks those lengths from the
corpus to waste few padding tokens; `BatchPlanner` deals the sentence pairs
of each epoch into batches of those shapes within the token budget.
"""

import numpy as np

# Lengths per axis considered by `learn_bucket_shapes`; longer tails are
# rounded up to quantiles so that the search stays small.
_GRID_SIZE = 64


def _grid(lengths):
    values = np.unique(lengths)
    if len(values) > _GRID_SIZE:
        quantiles = np.linspace(0.0, 1.0, _GRID_SIZE)
        values = np.unique(np.quantile(lengths, quantiles, method="higher"))
    return values


def learn_bucket_shapes(source_lengths, target_lengths, num_buckets=16):
    """Chooses padded ``(source_length, target_length)`` shapes for buckets.

    Each pair is padded to the cheapest shape that holds it; the shapes are
    chosen greedily, one at a time, to remove the most padding tokens,
    starting from the one shape that holds every pair.

    Args:
        source_lengths, target_lengths: per pair, the lengths after padding
            ids are added (source + end, target + start).
        num_buckets: the most shapes to return.

    Returns:
        A list of ``(source_length, target_length)`` int tuples, sorted by
        ``source_length + target_length``.
    """
    source_lengths = np.asarray(source_lengths, np.int64)
    target_lengths = np.asarray(target_lengths, np.int64)
    if len(source_lengths) == 0:
        raise ValueError(
            "Cannot choose bucket shapes for an empty corpus. Check that the "
            "corpus has sentence pairs under the length limit."
        )
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets} must be at least 1.")
    source_grid = _grid(source_lengths)
    target_grid = _grid(target_lengths)
    # Lengths rounded up to the grid; cells of the 2-D length histogram.
    cells, counts = np.unique(
        np.stack(
            [
                source_grid[np.searchsorted(source_grid, source_lengths)],
                target_grid[np.searchsorted(target_grid, target_lengths)],
            ],
            axis=1,
        ),
        axis=0,
        return_counts=True,
    )
    cell_area = cells.sum(axis=1)
    candidates = np.stack(
        np.meshgrid(source_grid, target_grid, indexing="ij"), axis=-1
    ).reshape(-1, 2)
    # (candidates, cells): padding per pair of the cell in the candidate,
    # or infinity where the pair does not fit.
    fits = (cells[None, :, 0] <= candidates[:, None, 0]) & (
        cells[None, :, 1] <= candidates[:, None, 1]
    )
    padding = np.where(
        fits,
        candidates.sum(axis=1)[:, None] - cell_area[None, :],
        np.inf,
    ).astype(np.float32)
    shapes = [(int(source_grid[-1]), int(target_grid[-1]))]
    current = (sum(shapes[0]) - cell_area).astype(np.float32)
    for _ in range(num_buckets - 1):
        gains = (np.maximum(current - padding, 0.0) * counts).sum(axis=1)
        best = int(np.argmax(gains))
        if gains[best] <= 0:
            break
        shapes.append(tuple(int(v) for v in candidates[best]))
        current = np.minimum(current, padding[best])
    return sorted(shapes, key=lambda s: (s[0] + s[1], s))


class BatchPlanner:
    """Deals sentence pairs into fixed-shape batches within a token budget.

    Bucket k has the padded shape ``(batch_size_k, source_length_k,
    target_length_k)`` with ``batch_size_k = max_tokens // max(
    source_length_k, target_length_k)``, so that no batch holds more than
    ``max_tokens`` (padded) tokens on either side. Each pair goes to the
    cheapest bucket that holds it. In each epoch, the pairs left over in
    a bucket that do not fill a batch move on to the bucket's successor,
    the smallest larger bucket that holds every pair of it; the largest
    bucket's leftovers make a short last batch, padded with empty rows
    (``sample_weight`` 0) to keep its shape. So every pair is in exactly
    one batch of each epoch, and every epoch has the same number of
    batches (`num_batches`).

    Args:
        source_lengths, target_lengths: per pair, the padded lengths
            needed (source + end, target + start).
        shapes: ``(source_length, target_length)`` of each bucket; the
            largest must hold every pair.
        max_tokens: the token budget of a batch, per side.
        batch_multiple: every batch size is rounded down to a multiple of
            this (the number of data-parallel replicas, so that each gets
            the same number of rows); the token budget stays the same.
    """

    def __init__(
        self,
        source_lengths,
        target_lengths,
        shapes,
        max_tokens,
        batch_multiple=1,
    ):
        self.source_lengths = np.asarray(source_lengths, np.int64)
        self.target_lengths = np.asarray(target_lengths, np.int64)
        shapes = sorted(
            {(int(s), int(t)) for s, t in shapes},
            key=lambda s: (s[0] + s[1], s),
        )
        longest = max(shapes, key=lambda s: max(s))
        if max_tokens < max(longest):
            raise ValueError(
                f"max_tokens={max_tokens} cannot hold one pair padded to "
                f"{longest} tokens. Raise max_tokens to at least "
                f"{max(longest)} or lower max_length."
            )
        if int(batch_multiple) != batch_multiple or batch_multiple < 1:
            raise ValueError(
                f"batch_multiple={batch_multiple} must be a positive int."
            )
        batch_multiple = int(batch_multiple)
        if max_tokens // max(longest) < batch_multiple:
            raise ValueError(
                f"max_tokens={max_tokens} holds {max_tokens // max(longest)} "
                f"pair(s) padded to {longest} tokens, fewer than "
                f"batch_multiple={batch_multiple} (one per replica). Raise "
                f"max_tokens to at least {batch_multiple * max(longest)} or "
                "lower max_length."
            )
        self.shapes = shapes
        self.batch_multiple = batch_multiple
        self.batch_sizes = [
            max_tokens // max(s) // batch_multiple * batch_multiple
            for s in shapes
        ]
        self.max_tokens = max_tokens
        # fits[k, i]: pair i fits in bucket k.
        self._fits = np.stack(
            [
                (self.source_lengths <= s) & (self.target_lengths <= t)
                for s, t in shapes
            ]
        )
        homeless = ~self._fits.any(axis=0)
        if homeless.any():
            i = int(np.argmax(homeless))
            raise ValueError(
                f"{int(homeless.sum())} pair(s) fit no bucket, e.g. pair {i} "
                f"with padded lengths ({self.source_lengths[i]}, "
                f"{self.target_lengths[i]}); the largest bucket is "
                f"{shapes[-1]}. Add a bucket boundary at least "
                f"{max(self.source_lengths.max(), self.target_lengths.max())}"
                " or lower max_length."
            )
        self.buckets = np.argmax(self._fits, axis=0)
        # successors[k]: the first later bucket that dominates bucket k
        # (holds any pair it holds), or None; the largest bucket has none.
        self.successors = [
            next(
                (
                    j
                    for j in range(k + 1, len(shapes))
                    if shapes[j][0] >= s and shapes[j][1] >= t
                ),
                None,
            )
            for k, (s, t) in enumerate(shapes)
        ]
        # Per bucket, pairs per epoch (own and carried over) and batches.
        self.bucket_pairs = np.bincount(self.buckets, minlength=len(shapes))
        self.bucket_batches = np.zeros(len(shapes), np.int64)
        for k in range(len(shapes)):
            pairs = int(self.bucket_pairs[k])
            size = self.batch_sizes[k]
            successor = self.successors[k]
            if successor is None:
                self.bucket_batches[k] = -(-pairs // size)
            else:
                self.bucket_batches[k] = pairs // size
                self.bucket_pairs[successor] += pairs % size

    @property
    def num_batches(self):
        """Batches per epoch."""
        return int(self.bucket_batches.sum())

    @property
    def batch_shapes(self):
        """``(batch_size, source_length, target_length)`` of each bucket."""
        return [
            (b, s, t)
            for b, (s, t) in zip(self.batch_sizes, self.shapes, strict=True)
        ]

    def batches(self, epoch=0, shuffle=True, seed=None):
        """The batches of one epoch.

        Args:
            epoch: the epoch number; with a seed, it selects the order.
            shuffle: shuffle the pairs and the batches; otherwise batches
                follow the corpus order.
            seed: the seed (None: a fresh random order).

        Returns:
            A list of ``(bucket, indices)``, with ``indices`` an int64
            array of pair indices.
        """
        rng = np.random.default_rng(None if seed is None else [seed, epoch])
        n = len(self.buckets)
        order = rng.permutation(n) if shuffle else np.arange(n)
        pending = [order[self.buckets[order] == k] for k in range(len(self))]
        batches = []
        for k, size in enumerate(self.batch_sizes):
            pairs = pending[k]
            successor = self.successors[k]
            full = (
                len(pairs) if successor is None else len(pairs) // size * size
            )
            batches.extend(
                (k, pairs[i : min(i + size, full)])
                for i in range(0, full, size)
            )
            if successor is not None:
                pending[successor] = np.concatenate(
                    [pending[successor], pairs[full:]]
                )
        if shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        else:
            batches.sort(key=lambda batch: batch[1].min())
        return batches

    def __len__(self):
        return len(self.shapes)
