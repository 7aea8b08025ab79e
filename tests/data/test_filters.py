"""The noise filters (components/data/filters.py): each drops what it should, at its threshold's edge, and keeps the
Korean, English and mixed prose of the sample chats."""

import json
from pathlib import Path

import pytest

from components.data.filters import REASONS, NoiseFilters
from components.data.near_dedup import row_text
from components.settings import Settings

SAMPLE = Path(__file__).parents[2] / "components" / "data" / "sample" / "instructions.jsonl"
KO = "가중치만 약 12GB가 필요합니다. 학습할 때는 기울기, 옵티마이저 상태, 활성값 때문에 훨씬 더 많이 필요합니다."
EN = "Save the state_dict, not the whole model object, and load it into a freshly built model."
MIXED = "fp32 형식은 파라미터당 4바이트를 씁니다. A state_dict is a plain mapping of tensor names to tensors."
GOPHER = NoiseFilters(max_duplicate_line_fraction=0.3, max_top_ngram_fraction=0.2)


def sample_texts() -> list[str]:
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    return [row_text({"messages": row["messages"]}) for row in rows]


def test_filters_off_keep_everything():
    off = NoiseFilters()
    assert not off.active
    assert off.describe() == "off"
    for text in ["", "!!!", "spam " * 500, "same line\n" * 50, "日本語のテキストです", KO, EN, MIXED]:
        assert off.reason(text) is None


def test_the_sample_chats_are_kept_under_gophers_thresholds_and_a_script_floor():
    filters = NoiseFilters(
        min_chars=20, max_duplicate_line_fraction=0.3, max_top_ngram_fraction=0.2, min_script_fraction=0.5
    )
    texts = sample_texts()
    assert len(texts) > 500
    dropped = {text[:60]: filters.reason(text) for text in texts if filters.reason(text)}
    assert dropped == {}


@pytest.mark.parametrize("text", [KO, EN, MIXED, f"{KO}\n{EN}\n{MIXED}"])
def test_normal_prose_is_kept(text):
    filters = NoiseFilters(
        min_chars=20,
        max_chars=1000,
        max_duplicate_line_fraction=0.3,
        max_top_ngram_fraction=0.2,
        min_script_fraction=0.9,
    )
    assert filters.active
    assert filters.reason(text) is None


def test_length_at_its_edges():
    filters = NoiseFilters(min_chars=10, max_chars=12)
    assert filters.reason("가" * 9) == "too_short"
    assert filters.reason("가" * 10) is None
    assert filters.reason("가" * 12) is None
    assert filters.reason("가" * 13) == "too_long"


def test_duplicate_lines_at_the_edge():
    # 10 non-empty lines, 3 of them copies of an earlier one (whitespace around a line aside): 0.3.
    lines = [f"{i}번째 줄입니다. Line number {i}." for i in range(7)]
    text = "\n".join([*lines, "", f"  {lines[0]}  ", lines[1], "   ", lines[1]])
    assert NoiseFilters(max_duplicate_line_fraction=0.3).reason(text) is None
    assert NoiseFilters(max_duplicate_line_fraction=0.29).reason(text) == "duplicate_lines"
    assert GOPHER.reason("메뉴 열기\n로그인\n메뉴 열기\n로그인\n메뉴 열기\n본문입니다.") == "duplicate_lines"
    assert GOPHER.reason("one line only") is None


def test_top_ngram_at_the_edge():
    # 50 words: "new york" 5 times (35 letters) and 40 unique fillers of 3 or 4 letters (140): 35 / 175 = 0.2.
    blocks = [["new", "york", *(f"a{i}{j}" for j in range(4)), *(f"b{i}0{j}" for j in range(4))] for i in range(5)]
    text = " ".join(word for block in blocks for word in block)
    assert len(text.split()) == 50
    assert sum(map(len, text.split())) == 175
    assert NoiseFilters(max_top_ngram_fraction=0.2).reason(text) is None
    assert NoiseFilters(max_top_ngram_fraction=0.19).reason(text) == "top_ngram"


def test_top_ngram_counts_the_words_a_repeated_word_covers_once():
    # "very very very very": the 2-gram (very, very) occurs 3 times but covers the 4 words once: 16 of 200 letters
    # (counting each occurrence would make it 24).
    text = "it is very very very very good " + " ".join(f"f{i:03}" for i in range(44))
    assert NoiseFilters(max_top_ngram_fraction=0.08).reason(text) is None
    assert NoiseFilters(max_top_ngram_fraction=0.079).reason(text) == "top_ngram"
    assert GOPHER.reason("구매하기 " * 60) == "top_ngram"
    assert GOPHER.reason("click here " * 30 + EN) == "top_ngram"


def test_top_ngram_leaves_a_text_of_fewer_than_50_words_alone():
    assert GOPHER.reason("광고 " * 49) is None
    assert GOPHER.reason("광고 " * 50) == "top_ngram"
    # A short answer that repeats its question (one 2-gram twice in 6 words), or repeats nothing.
    assert GOPHER.reason("대한민국의 수도는 어디인가요?\n대한민국의 수도는 서울입니다.") is None
    assert GOPHER.reason("네, 맞습니다.") is None


def test_script_fraction_at_the_edge():
    # 4 Hangul letters, 1 Latin, 5 Hiragana: hangul+latin are half the letters; digits and punctuation do not count.
    text = "한국어요 a 123, ひらがなで!"
    assert NoiseFilters(min_script_fraction=0.5).reason(text) is None
    assert NoiseFilters(min_script_fraction=0.51).reason(text) == "script_fraction"
    assert NoiseFilters(min_script_fraction=0.5, scripts=("hiragana",)).reason(text) is None
    assert NoiseFilters(min_script_fraction=0.51, scripts=("hiragana",)).reason(text) == "script_fraction"


def test_script_fraction_of_a_text_with_no_letters_is_zero():
    filters = NoiseFilters(min_script_fraction=0.1)
    assert filters.reason("1234 5678 = 6912 !!! ... ---") == "script_fraction"
    assert filters.reason("") == "script_fraction"


@pytest.mark.parametrize(
    "scripts, letters, others",
    [
        (("hangul",), "가힣ㄱㅏꥠힰﾡ\u1100\u1161\u11a8", "ひカ漢aЖ"),
        (("latin",), "AzÀÿĀſƀɏḀỹＡｚ", "가ひ漢Ж×÷ªµ"),
        (("han",), "漢字中国語㐀豈𠀀", "가ひカaЖ"),
        (("hiragana",), "ぁゖ", "가カ漢a"),
        (("katakana",), "ァヺーｱ", "가ひ漢a"),
        (("cyrillic",), "ЖжЀӿԯ", "가ひ漢a"),
    ],
)
def test_each_script_counts_its_own_letters(scripts, letters, others):
    filters = NoiseFilters(min_script_fraction=1.0, scripts=scripts)
    for ch in letters:
        assert filters.reason(ch) is None, ch
    for ch in others:
        assert filters.reason(ch) == "script_fraction", ch


def test_cheapest_first():
    text = "스팸\n" * 40
    filters = NoiseFilters(
        min_chars=1000, max_duplicate_line_fraction=0.3, max_top_ngram_fraction=0.2, min_script_fraction=1.0
    )
    assert filters.reason(text) == "too_short"
    assert NoiseFilters(max_duplicate_line_fraction=0.3, max_top_ngram_fraction=0.2).reason(text) == "duplicate_lines"
    spam = "スパム " * 60
    assert NoiseFilters(max_top_ngram_fraction=0.2, min_script_fraction=0.5).reason(spam) == "script_fraction"
    assert NoiseFilters(max_top_ngram_fraction=0.2).reason(spam) == "top_ngram"
    assert REASONS == ("too_short", "too_long", "duplicate_lines", "script_fraction", "top_ngram")


def test_row_reason_reads_every_string_of_a_canonical_row():
    filters = NoiseFilters(max_duplicate_line_fraction=0.3)
    chat = {"messages": [{"role": "user", "content": "안녕하세요"}, {"role": "assistant", "content": "안녕하세요"}]}
    assert filters.row_reason({**chat, "split_key": "k"}) == "duplicate_lines"
    assert filters.row_reason({"text": f"{KO}\n{EN}", "split_key": "k"}) is None


def test_from_settings():
    assert not NoiseFilters.from_settings(Settings.from_flat({}).data).active
    data = Settings.from_flat(
        {
            "filter_min_chars": 50,
            "filter_max_chars": 100_000,
            "filter_max_duplicate_line_fraction": 0.3,
            "filter_max_top_ngram_fraction": 0.2,
            "filter_min_script_fraction": 0.5,
            "filter_scripts": ["hangul", "latin", "han"],
        }
    ).data
    filters = NoiseFilters.from_settings(data)
    assert filters == NoiseFilters(
        min_chars=50,
        max_chars=100_000,
        max_duplicate_line_fraction=0.3,
        max_top_ngram_fraction=0.2,
        min_script_fraction=0.5,
        scripts=("hangul", "latin", "han"),
    )
    assert filters.describe() == (
        "chars < 50, chars > 100000, duplicate lines > 0.3, hangul+latin+han letters < 0.5, top word 2-gram > 0.2"
    )


def test_an_unknown_script_is_an_error():
    with pytest.raises(ValueError, match="greek"):
        NoiseFilters(min_script_fraction=0.5, scripts=("hangul", "greek"))


def test_the_data_step_drops_and_counts_what_the_filters_find(tokenizer_dir, tmp_path):
    from components.data.prepare import PrepareOptions, prepare
    from components.data.report import markdown
    from tests.helpers.data import conversation, write_jsonl

    rows = [conversation(i, "en") for i in range(40)]
    rows += [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}]
    rows += [{"messages": [{"role": "user", "content": "spam"}, {"role": "assistant", "content": "buy now\n" * 6}]}]
    write_jsonl(tmp_path / "chats.jsonl", rows)
    filters = NoiseFilters(min_chars=10, max_duplicate_line_fraction=0.3)
    for shards in (0, 2):
        stats = prepare(
            str(tmp_path / "chats.jsonl"),
            tokenizer_dir,
            str(tmp_path / f"o{shards}"),
            PrepareOptions(256, 0.1, 7, filters=filters, shards=shards),
        )
        assert stats["dropped"]["too_short"] == 1 and stats["dropped"]["duplicate_lines"] == 1, stats["dropped"]
        assert stats["rows_kept"] == 40
    assert "too_short" in markdown(stats) and "duplicate_lines" in markdown(stats)
