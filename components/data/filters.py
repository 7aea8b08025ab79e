"""Noise filters (``filter_*`` settings): rows of boilerplate, spam or another language are dropped while reading.

One :class:`NoiseFilters` per data step; :meth:`NoiseFilters.reason` takes a row's text (every string of it:
:func:`components.data.near_dedup.row_text`) and gives the reason it is dropped, one of :data:`REASONS`, or None.
Each filter is off at 0, and the checks run cheapest first, so a row pays only for the filters that are on, up to
the first that drops it:

- ``too_short`` / ``too_long``: fewer characters than ``min_chars``, more than ``max_chars``.
- ``duplicate_lines``: the lines that repeat an earlier line (whitespace around a line aside) over all non-empty
  lines, above ``max_duplicate_line_fraction`` (Gopher's 0.3: Rae et al. 2021, table A1).
- ``script_fraction``: the letters (Unicode category L*) of ``scripts`` over all letters, below
  ``min_script_fraction``; a text with no letters at all has fraction 0. A script's letters are those of its
  Unicode blocks whose names start with its name (``LATIN``, ``HANGUL``, ``CJK UNIFIED IDEOGRAPH``, ...), halfwidth
  and fullwidth forms included; ``ー`` (KATAKANA-HIRAGANA PROLONGED SOUND MARK) counts as katakana.
- ``top_ngram``: the letters of the words the most frequent word 2-gram's occurrences cover, over the letters of
  all words (words split on whitespace: Korean eojeol are words), above ``max_top_ngram_fraction`` (Gopher's 0.2),
  in a text of :data:`MIN_NGRAM_WORDS` words or more.

Gopher ran its repetition filters only on documents of 50 words or more (its quality filter drops the shorter
ones first); a chat row is often shorter, and its answer repeats the question ("대한민국의 수도는 어디인가요?" /
"대한민국의 수도는 서울입니다."): one 2-gram twice in 9 words is 0.44. So the 2-gram filter leaves a text of fewer
than :data:`MIN_NGRAM_WORDS` words alone (at 0.2 it dropped 12 of the 537 sample chats, all under 50 words; it drops
none with the floor); a short spam row is left to ``min_chars`` and the exact and near-duplicate removal. Where the
well-known implementations differ, this follows the definition rather than one of them: a 2-gram that occurs once
repeats nothing and scores 0 (datatrove counts the single occurrence and NeMo Curator gives a text of fewer than two
words 1.0); a run of one repeated word ("very very very") counts its words once, not once per overlapping 2-gram;
the joining spaces are not counted on either side. Ties for the most frequent 2-gram take the longest.

Why not datatrove's Gopher helpers (``datatrove.pipeline.filters.gopher_repetition_filter``; datatrove 0.10.1
from PyPI, checked in a separate venv): importing them fails without its ``processing`` extra
(``datatrove.pipeline.filters`` imports the C4 filters, which import ``regex``: ModuleNotFoundError); with ``regex``
added they import in 0.4 s and bring loguru, multiprocess, dill and humanize into the data step, for two
functions of ten lines. ``find_top_duplicate`` also measures something else (``len(" ".join(ngram)) * count``:
spaces, overlapping and single occurrences counted, and its filter divides by ``len(text)``) and took 171 us a row
where :func:`top_ngram_fraction` takes 77 us (it joins every 2-gram into a new string); ``find_duplicates`` on the
lines took 12-16 us a row, as :func:`duplicate_line_fraction` does (best of 7 on the rows below, same Python 3.11.7).

Speed, on the 2-core development machine while it ran the test suite (best of 3; single runs vary from 3,000 to
6,900 rows/s with the load), 2,000 rows of 2,000 characters cut from 12 joined sample chats (Korean and English,
code blocks), every filter on (Gopher's thresholds, hangul and latin at 0.5; 7 rows dropped: the same templated
lines of the math chats joined): about 7,000 rows/s (140 us a row, 14 million characters a second) on one core;
each filter alone: length 0.1 us, duplicate lines 11 us, script fraction 53 us, top 2-gram 75 us; all off: 0.1 us.
Building the script pattern takes 8 ms for hangul and latin, 45 ms with han, once per process. The command::

    python - <<'EOF'
    import json, random, time
    from components.data.filters import NoiseFilters
    from components.data.near_dedup import row_text
    lines = open("components/data/sample/instructions.jsonl", encoding="utf-8")
    chats = [row_text({"messages": json.loads(line)["messages"]}) for line in lines]
    rng = random.Random(0)
    rows = ["\\n".join(rng.choice(chats) for _ in range(12))[:2000] for _ in range(2000)]
    f = NoiseFilters(max_duplicate_line_fraction=0.3, max_top_ngram_fraction=0.2, min_script_fraction=0.5)
    f.reason(rows[0])
    t = time.perf_counter(); dropped = sum(f.reason(r) is not None for r in rows); t = time.perf_counter() - t
    print(f"{len(rows) / t:,.0f} rows/s, {dropped} dropped")
    EOF
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.data.near_dedup import row_text

if TYPE_CHECKING:
    from components.settings import DataSettings

# The reasons :meth:`NoiseFilters.reason` gives, in the order it checks them (cheapest first).
REASONS = ("too_short", "too_long", "duplicate_lines", "script_fraction", "top_ngram")

# Gopher's minimum document length: below it one repeated 2-gram is a large share of any text (see above).
MIN_NGRAM_WORDS = 50

# Each script's Unicode blocks and the name prefixes of its letters there (a letter: str.isalpha, category L*).
SCRIPT_BLOCKS: dict[str, tuple[tuple[tuple[int, int], ...], tuple[str, ...]]] = {
    "hangul": (
        # Jamo, Compatibility Jamo, Jamo Extended-A, Syllables + Jamo Extended-B, halfwidth forms
        ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7FF), (0xFFA0, 0xFFDC)),
        ("HANGUL", "HALFWIDTH HANGUL"),
    ),
    "latin": (
        # ASCII and Latin-1 letters, Extended-A and -B, IPA, Extended Additional, -C, -D, -E, fullwidth forms
        ((0x41, 0x2AF), (0x1E00, 0x1EFF), (0x2C60, 0x2C7F), (0xA720, 0xA7FF), (0xAB30, 0xAB6F), (0xFF21, 0xFF5A)),
        ("LATIN", "FULLWIDTH LATIN"),
    ),
    "han": (
        # CJK Unified Ideographs, Extension A, Compatibility Ideographs, Extensions B to H (planes 2 and 3)
        ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x323AF)),
        ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH"),
    ),
    "hiragana": (((0x3040, 0x309F),), ("HIRAGANA",)),
    "katakana": (
        ((0x30A0, 0x30FF), (0x31F0, 0x31FF), (0xFF65, 0xFF9F)),
        ("KATAKANA", "HALFWIDTH KATAKANA"),
    ),
    "cyrillic": (((0x400, 0x52F), (0x1C80, 0x1C8F), (0xA640, 0xA69F)), ("CYRILLIC",)),
}


@functools.cache
def script_letters(scripts: tuple[str, ...]) -> re.Pattern[str]:
    """A pattern matching runs of the letters of ``scripts`` (a character class: no backtracking); built once per
    set of scripts (han's 80,000 code points take about 50 ms)."""
    letters = [
        cp
        for name in scripts
        for lo, hi in SCRIPT_BLOCKS[name][0]
        for cp in range(lo, hi + 1)
        if chr(cp).isalpha() and unicodedata.name(chr(cp), "").startswith(SCRIPT_BLOCKS[name][1])
    ]
    ranges: list[list[int]] = []
    for cp in sorted(set(letters)):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges) + "]+")


def duplicate_line_fraction(text: str) -> float:
    """The non-empty lines of ``text`` that repeat an earlier line (stripped), over all non-empty lines."""
    lines = [line for line in map(str.strip, text.splitlines()) if line]
    return (len(lines) - len(set(lines))) / len(lines) if lines else 0.0


def script_fraction(text: str, scripts: tuple[str, ...]) -> float:
    """The letters of ``scripts`` in ``text`` over all its letters; 0 when it has none."""
    rest = script_letters(scripts).sub("", text)
    ours = len(text) - len(rest)
    letters = ours + sum(map(str.isalpha, rest))
    return ours / letters if letters else 0.0


def top_ngram_fraction(text: str) -> float:
    """The characters of the words that the most frequent word 2-gram's occurrences cover, over the characters of
    all words; 0 when no 2-gram occurs twice, or the text has fewer than :data:`MIN_NGRAM_WORDS` words."""
    words = text.split()
    if len(words) < MIN_NGRAM_WORDS:
        return 0.0
    counts = Counter(zip(words, words[1:], strict=False))
    top = max(counts.values(), default=0)
    if top < 2:
        return 0.0
    covered = 0
    for a, b in [gram for gram, n in counts.items() if n == top]:
        if a != b:  # occurrences of (a, b) with a != b cannot overlap
            covered = max(covered, top * (len(a) + len(b)))
        else:  # a run of k copies of a is k - 1 overlapping occurrences that cover its k words once
            last = len(words) - 1
            in_runs = sum(
                1
                for i, w in enumerate(words)
                if w == a and ((i > 0 and words[i - 1] == a) or (i < last and words[i + 1] == a))
            )
            covered = max(covered, in_runs * len(a))
    return covered / sum(map(len, words))


@dataclass(frozen=True)
class NoiseFilters:
    """The ``filter_*`` settings of the data step (:class:`components.settings.DataSettings`), each off at 0.

    Args:
        min_chars: ``filter_min_chars``: drop a text of fewer characters.
        max_chars: ``filter_max_chars``: drop a text of more characters.
        max_duplicate_line_fraction: ``filter_max_duplicate_line_fraction``: drop above this share of repeated
            lines (Gopher: 0.3).
        max_top_ngram_fraction: ``filter_max_top_ngram_fraction``: drop when the most frequent word 2-gram covers
            more than this share of the words' characters (Gopher: 0.2), in a text of at least
            :data:`MIN_NGRAM_WORDS` words.
        min_script_fraction: ``filter_min_script_fraction``: drop when the letters of ``scripts`` are less than
            this share of all letters.
        scripts: ``filter_scripts``: names of :data:`SCRIPT_BLOCKS`.
    """

    min_chars: int = 0
    max_chars: int = 0
    max_duplicate_line_fraction: float = 0.0
    max_top_ngram_fraction: float = 0.0
    min_script_fraction: float = 0.0
    scripts: tuple[str, ...] = ("hangul", "latin")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.scripts) - set(SCRIPT_BLOCKS))
        if unknown:
            raise ValueError(f"unknown scripts {unknown} in filter_scripts; known: {sorted(SCRIPT_BLOCKS)}")
        if self.min_script_fraction and not self.scripts:
            raise ValueError("filter_min_script_fraction needs at least one script in filter_scripts")

    @classmethod
    def from_settings(cls, data: DataSettings) -> NoiseFilters:
        """The filters of a run's data settings (``Settings.data``)."""
        return cls(
            min_chars=data.filter_min_chars,
            max_chars=data.filter_max_chars,
            max_duplicate_line_fraction=data.filter_max_duplicate_line_fraction,
            max_top_ngram_fraction=data.filter_max_top_ngram_fraction,
            min_script_fraction=data.filter_min_script_fraction,
            scripts=tuple(data.filter_scripts),
        )

    @property
    def active(self) -> bool:
        """Whether any filter is on."""
        return bool(
            self.min_chars
            or self.max_chars
            or self.max_duplicate_line_fraction
            or self.max_top_ngram_fraction
            or self.min_script_fraction
        )

    def describe(self) -> str:
        """The filters that are on, in the order they are checked, for the data report; "off" when none is."""
        parts = []
        if self.min_chars:
            parts.append(f"chars < {self.min_chars}")
        if self.max_chars:
            parts.append(f"chars > {self.max_chars}")
        if self.max_duplicate_line_fraction:
            parts.append(f"duplicate lines > {self.max_duplicate_line_fraction}")
        if self.min_script_fraction:
            parts.append(f"{'+'.join(self.scripts)} letters < {self.min_script_fraction}")
        if self.max_top_ngram_fraction:
            parts.append(f"top word 2-gram > {self.max_top_ngram_fraction}")
        return ", ".join(parts) or "off"

    def reason(self, text: str) -> str | None:
        """Why ``text`` (a row's text) is dropped, one of :data:`REASONS`; None: it is kept."""
        if self.min_chars and len(text) < self.min_chars:
            return "too_short"
        if self.max_chars and len(text) > self.max_chars:
            return "too_long"
        if self.max_duplicate_line_fraction and duplicate_line_fraction(text) > self.max_duplicate_line_fraction:
            return "duplicate_lines"
        if self.min_script_fraction and script_fraction(text, self.scripts) < self.min_script_fraction:
            return "script_fraction"
        if self.max_top_ngram_fraction and top_ngram_fraction(text) > self.max_top_ngram_fraction:
            return "top_ngram"
        return None

    def row_reason(self, row: dict) -> str | None:
        """:meth:`reason` for a canonical row (text, messages or preference): every string of it joined."""
        return self.reason(row_text(row))
