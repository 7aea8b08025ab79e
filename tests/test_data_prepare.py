"""prepare_dataset's plain module: assistant-only labels, a stable split, atomic output, clear errors."""

import json
import unicodedata

import datasets
import pytest

from components.data.prepare import DataError, prepare, tokenize_conversation
from components.models.tiny import build_tokenizer
from tests.conftest import run_cli


def _conv(i: int, lang: str = "en") -> dict:
    if lang == "ko":
        return {"messages": [{"role": "user", "content": f"{i} 더하기 {i}는 무엇입니까?"},
                             {"role": "assistant", "content": f"정답은 {2 * i}입니다."}]}
    return {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": f"What is {i} plus {i}?"},
                         {"role": "assistant", "content": f"The answer is {2 * i}."}]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chat.jsonl"
    path.write_text("\n".join(json.dumps(_conv(i, "ko" if i % 2 else "en"), ensure_ascii=False) for i in range(60)))
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(corpus).save_pretrained(out)
    return str(out)


def test_labels_cover_exactly_the_assistant_turns(corpus):
    tok = build_tokenizer(corpus)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
                {"role": "user", "content": "And?"}, {"role": "assistant", "content": "Bye."}]
    ids, labels = tokenize_conversation(tok, messages)
    assert len(ids) == len(labels)
    learned = tok.decode([t for t, l in zip(ids, labels) if l != -100])
    assert learned == "Hello there.<|im_end|>\nBye.<|im_end|>\n"
    assert all(l == -100 or l == t for t, l in zip(ids, labels))


def test_prepare_writes_train_eval_and_stats(corpus, tokenizer_dir, tmp_path):
    out = tmp_path / "prepared"
    stats = prepare(str(corpus), tokenizer_dir, str(out), max_seq_length=128, eval_size=0.2, seed=1)
    ds = datasets.load_from_disk(str(out))
    assert set(ds) == {"train", "eval"} and len(ds["eval"]) == 12 and len(ds["train"]) == 48
    assert ds["train"].column_names == ["input_ids", "labels"]
    assert json.loads((out / "stats.json").read_text()) == stats
    assert [p.name for p in tmp_path.iterdir()] == ["prepared"]  # no temporary folder left behind


def test_split_is_deterministic_and_seeded(corpus, tokenizer_dir, tmp_path):
    def eval_rows(seed, name):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / name), 128, 0.2, seed)
        return sorted(map(tuple, datasets.load_from_disk(str(tmp_path / name))["eval"]["input_ids"]))

    assert eval_rows(1, "a") == eval_rows(1, "b")
    assert eval_rows(1, "a") != eval_rows(2, "c")


def test_decomposed_hangul_is_normalised(tokenizer_dir, tmp_path):
    nfd = unicodedata.normalize("NFD", "안녕하세요")
    src = tmp_path / "nfd.jsonl"
    rows = [{"messages": [{"role": "user", "content": nfd}, {"role": "assistant", "content": f"{nfd} {i}"}]} for i in range(4)]
    src.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    prepare(str(src), tokenizer_dir, str(tmp_path / "out"), 128, 1, 0)
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(tokenizer_dir).decode(datasets.load_from_disk(str(tmp_path / "out"))["train"][0]["input_ids"])
    assert "안녕하세요" in text and unicodedata.is_normalized("NFC", text)


@pytest.mark.parametrize("lines, message", [
    (None, "no such file"),
    ([], "the dataset is empty"),
    (['{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}', "{not json"], ":2: not valid JSON"),
    (['{"text": "hello"}'], "no 'messages' field (found ['text'])"),
    (['{"messages": [{"role": "robot", "content": "a"}]}'], "unknown role 'robot'"),
    (['{"messages": [{"role": "user", "content": "a"}]}'], "no assistant turn"),
])
def test_bad_data_is_one_clear_error_and_nothing_is_written(lines, message, tokenizer_dir, tmp_path):
    src = tmp_path / "bad.jsonl"
    if lines is not None:
        src.write_text("\n".join(lines))
    out = tmp_path / "out"
    with pytest.raises(DataError) as e:
        prepare(str(src), tokenizer_dir, str(out), 128, 0.5, 0)
    assert message in str(e.value)
    assert not out.exists()


def test_eval_size_must_leave_both_splits(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DataError, match="eval_size 60 gives 60 eval conversations out of 60"):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), 128, 60, 0)


def test_every_row_over_length_is_an_error(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DataError, match="longer than max_seq_length=4 tokens; raise max_seq_length"):
        prepare(str(corpus), tokenizer_dir, str(tmp_path / "o"), 4, 0.2, 0)


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
    with pytest.raises(DataError, match="has no chat template"):
        prepare(str(corpus), str(tmp_path / "plain"), str(tmp_path / "o"), 128, 0.2, 0)


def test_command_line_is_the_same_code(corpus, tokenizer_dir, tmp_path):
    ok = run_cli("components.data.prepare", "--source", str(corpus), "--tokenizer", tokenizer_dir,
                 "--out", str(tmp_path / "o"), "--max-seq-length", "128", "--eval-size", "0.2")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["train"]["rows"] == 48
    bad = run_cli("components.data.prepare", "--source", str(tmp_path / "missing.jsonl"), "--tokenizer", tokenizer_dir,
                  "--out", str(tmp_path / "o2"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "no such file" in bad.stderr
