"""Near-duplicate removal (``near_dedup_threshold``): rows whose text nearly repeats an earlier row's are dropped.

Exact duplicates are always dropped while reading (:mod:`components.data.reading`); this catches the copies that
differ in a word, a date or the whitespace: the same manual page in two releases, a scraped article with another
footer. Each row's text (every string of it: a document, or the turns of a conversation) becomes the set of its
word 5-grams; a MinHash signature of that set estimates the Jaccard similarity of two rows, and locality-sensitive
hashing (``datasketch``'s ``MinHashLSH``, its bands and rows chosen for ``threshold``) finds, for each row, the
earlier rows that are probably at least that similar without comparing every pair. Each such candidate's signature
is then compared with the row's (the share of equal hash values estimates the similarity), so the bands can favour
finding near-duplicates over sparing false candidates, and a threshold above what LSH's bands support (0.99 at 128
permutations) still works. The first of a group is kept: rows are taken in reading order (training sources, then
eval sources), so an eval row that nearly repeats a training row is dropped rather than leaking it.

``datasketch`` is imported only when the threshold is set (a core dependency: pyproject.toml).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from components.data.formats import DataError

log = logging.getLogger("prepare_dataset")

NUM_PERM = 128  # permutations per signature: the estimate's standard error is at most 0.5/sqrt(128) ~ 0.044
NGRAM = 5  # words per shingle: short enough that one changed word leaves most shingles of a paragraph intact
BATCH_ROWS = 1000
LSH_MAX_THRESHOLD = 0.95  # datasketch finds no bands above 0.99 for 128 permutations; candidates are checked anyway
# LSH's bands weigh a missed near-duplicate 9x a false candidate (datasketch's default: equally), since every candidate
# is checked against its signature: at 0.8 a pair of similarity 0.85 is found ~97% of the time instead of ~69%.
LSH_WEIGHTS = (0.1, 0.9)


def row_text(row: dict) -> str:
    """Every string of a canonical row joined (``split_key`` and turn roles are not text)."""
    parts: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                if k != "role":
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk({k: v for k, v in row.items() if k != "split_key"})
    return "\n".join(parts)


def shingles(text: str) -> set[bytes]:
    """The word ``NGRAM``-grams of ``text`` (a text shorter than that: its words as one shingle)."""
    words = text.split()
    if len(words) <= NGRAM:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + NGRAM]).encode() for i in range(len(words) - NGRAM + 1)}


def _minhash():
    try:
        from datasketch import MinHash  # type: ignore[import-untyped]  # no type information
    except ImportError:
        raise DataError(
            "near_dedup_threshold needs the datasketch package, which this environment lacks "
            "(pip install datasketch==2.0.0, or the local extra); or set near_dedup_threshold=0 (off)"
        ) from None
    return MinHash


def signatures(rows) -> np.ndarray:
    """Each row's MinHash signature (``NUM_PERM`` values below 2**32) of its word shingles: (len(rows), NUM_PERM)
    uint32; ``rows`` a ``datasets.Dataset`` of canonical rows. A data shard computes them where it reads the text."""
    MinHash = _minhash()
    out = np.zeros((len(rows), NUM_PERM), dtype=np.uint32)
    # Drawn once (seed 1, datasketch's default): drawing them for every row was a quarter of the time.
    first = MinHash(num_perm=NUM_PERM)
    permutations, scheme = first.permutations, first.scheme
    i = 0
    for batch in rows.iter(batch_size=BATCH_ROWS):
        for row in ({k: batch[k][j] for k in batch} for j in range(len(batch["split_key"]))):
            m = MinHash(num_perm=NUM_PERM, permutations=permutations, scheme=scheme)
            m.update_batch(list(shingles(row_text(row))))
            out[i] = m.hashvalues.astype(np.uint32)
            i += 1
    return out


def near_duplicates_of(sigs: np.ndarray, threshold: float) -> np.ndarray:
    """A mask over the rows whose signatures are ``sigs`` (in order): True for each row whose estimated Jaccard
    similarity to an earlier kept row is at least ``threshold`` (0 < threshold <= 1)."""
    from datasketch import LeanMinHash, MinHashLSH

    scheme = _minhash()(num_perm=NUM_PERM).scheme  # the scheme signatures() hashed with
    lsh = MinHashLSH(threshold=min(threshold, LSH_MAX_THRESHOLD), num_perm=NUM_PERM, weights=LSH_WEIGHTS)
    drop = np.zeros(len(sigs), dtype=bool)
    for i, signature in enumerate(sigs):
        m = LeanMinHash(seed=1, hashvalues=signature.astype(np.uint64), scheme=scheme)
        candidates = lsh.query(m)
        # each candidate checked against its signature: the bands may favour recall (LSH_WEIGHTS)
        if candidates and (sigs[candidates] == signature).mean(axis=1).max() >= threshold:
            drop[i] = True
        else:
            lsh.insert(i, m, check_duplication=False)
    return drop


def near_duplicates(rows, threshold: float) -> np.ndarray:
    """A mask over ``rows`` (a ``datasets.Dataset`` of canonical rows): True for each row whose estimated Jaccard
    similarity to an earlier kept row is at least ``threshold`` (0 < threshold <= 1)."""
    started = time.time()
    drop = near_duplicates_of(signatures(rows), threshold)
    log.info(
        "near-duplicates (MinHash LSH, threshold %s): %d of %d rows dropped in %.1fs",
        threshold,
        int(drop.sum()),
        len(drop),
        time.time() - started,
    )
    return drop
