"""Bad input to prepare_dataset: one clear error naming the file, line or column and the fix; nothing written."""

import json

import pytest

from components.data.prepare import DataError, PrepareOptions, prepare
from tests.helpers.data import write_jsonl

OK = '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'


def ok(i):
    return json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]})


@pytest.mark.parametrize(
    "fmt, lines, message",
    [
        ("auto", None, "no such file or folder"),
        ("auto", [], "the dataset is empty"),
        ("auto", [OK, "{not json"], "bad.jsonl:2: not valid JSON"),
        (
            "messages",
            ['{"text": "hello"}'],
            "bad.jsonl:1: format 'messages' needs column(s) ['messages'] but found ['text']",
        ),
        ("auto", [OK, '{"instruction": "a", "output": "b"}'], "bad.jsonl:2: mixed formats: this row is 'alpaca' but"),
        ("auto", [OK, '{"foo": 1}'], "bad.jsonl:2: format 'messages' needs column(s) ['messages'] but found ['foo']"),
        ("auto", ['{"messages": [{"role": "robot", "content": "a"}]}'], "bad.jsonl:1: unknown role 'robot'"),
        # ShareGPT's role in OpenAI rows (a whole local run's case before; issue 38, CI's time: the run's framing of
        # a data error is tests/pipelines/test_local_run.py's)
        (
            "auto",
            [OK, json.dumps({"messages": [{"role": "human", "content": "hi"}, {"role": "assistant", "content": "b"}]})],
            "bad.jsonl:2: unknown role 'human'",
        ),
        ("auto", ['{"messages": [{"role": "user", "content": "a"}]}'], "every row of"),
        (
            "auto",
            ['{"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "b"}]}'],
            "filtered out",
        ),
    ],
)
def test_bad_data_is_one_clear_error_and_nothing_is_written(fmt, lines, message, tokenizer_dir, tmp_path):
    src = tmp_path / "bad.jsonl"
    if lines is not None:
        write_jsonl(src, lines)
    out = tmp_path / "out"
    with pytest.raises(DataError) as e:
        prepare(str(src), tokenizer_dir, str(out), PrepareOptions(128, 0.5, 0, format=fmt))
    assert message in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if lines is None else ["bad.jsonl"])


def test_invalid_utf8_names_the_line(tokenizer_dir, tmp_path):
    src = tmp_path / "latin1.jsonl"
    src.write_bytes(OK.encode() + b"\n" + '{"messages": [{"role": "user", "content": "caf\xe9"}]}'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.jsonl:2: invalid UTF-8 at byte \d+ of the line; re-encode"):
        prepare(str(src), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 0.5, 0))


def test_unparseable_lines_can_be_skipped_up_to_a_cap(tokenizer_dir, tmp_path):
    src = write_jsonl(
        tmp_path / "d.jsonl",
        [ok(i) for i in range(8)] + ["{broken", "[1, 2]", '{"messages": [{"role": "bot", "content": "x"}]}'],
    )
    stats = prepare(str(src), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 2, 0, max_bad_rows=3))
    assert stats["dropped"] == {"unparseable": 2, "unknown_role": 1, "over_length": 0} and stats["rows_kept"] == 8
    with pytest.raises(
        DataError, match=r"d.jsonl:11: unknown role 'bot'.*more than the 2 bad rows --max-bad-rows allows"
    ):
        prepare(str(src), tokenizer_dir, str(tmp_path / "o2"), PrepareOptions(128, 2, 0, max_bad_rows=2))


def test_unknown_columns_list_what_was_found(tokenizer_dir, tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", ['{"question": "a", "reply": "b"}'])
    with pytest.raises(DataError, match=r"cannot tell the format from the columns \['question', 'reply'\].*--columns"):
        prepare(str(src), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 0.5, 0))


def test_chat_and_text_sources_do_not_mix(tokenizer_dir, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [ok(i) for i in range(4)])
    b = write_jsonl(tmp_path / "b.jsonl", ['{"text": "plain"}'])
    with pytest.raises(DataError, match=r"mixed formats: .*b.jsonl' is 'text'"):
        prepare([str(a), str(b)], tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 1, 0))


def test_eval_size_must_leave_both_splits(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DataError, match="--eval-size 60 gives 60 eval rows out of 60"):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(128, 60, 0))


def test_every_row_over_length_is_an_error(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DataError, match=r"every train row was filtered out \(dropped: \{'over_length': 60\}\)"):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(24, 0.2, 0))
    assert not (tmp_path / "o").exists()


def test_max_seq_length_below_the_template_overhead(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DataError, match=r"max_seq_length=8 is not more than the chat template's own \d+ tokens"):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), PrepareOptions(8, 0.2, 0))


def test_tokenizer_without_chat_template_is_rejected(corpus, tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "plain")
    cfg = tmp_path / "plain" / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data.pop("chat_template", None)
    cfg.write_text(json.dumps(data))
    (tmp_path / "plain" / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(DataError, match="the tokenizer has no chat template"):
        prepare(str(corpus), str(tmp_path / "plain"), str(tmp_path / "o"), PrepareOptions(128, 0.2, 0))


def test_unmounted_claim_and_bad_options(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DataError, match=r"claim 'other' is not mounted in this step \(mounted: \['data'\]\)"):
        prepare(
            "pvc://other/x.jsonl",
            tokenizer_dir,
            str(tmp_path / "o"),
            PrepareOptions(128, 0.2, 0, pvc_mounts={"data": str(tmp_path)}),
        )
    with pytest.raises(DataError, match="format 'chatml': use auto or one of.*over_length 'cut': use drop or truncate"):
        prepare(
            str(corpus),
            tokenizer_dir,
            str(tmp_path / "o"),
            PrepareOptions(128, 0.2, 0, format="chatml", over_length="cut"),
        )
