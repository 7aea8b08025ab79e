"""The corpus settings of the data step, checked before any GPU is requested: the cpt stage's chunk overlap below
the chunk length (max_seq_length), and near_dedup_threshold in (0, 1] or 0 (off); each problem one error naming
its setting."""

import pytest

from components.validate.rules import check
from pipelines import params as P


def local(**over) -> dict:
    return {**P.resolve("local-tiny"), "stages": ["cpt", "sft"], "cpt_dataset_source": "builtin:domain-text", **over}


def only(errors: list[str], setting: str) -> str:
    named = [e for e in errors if setting in e]
    assert len(named) == 1 and len(errors) == 1, errors
    return named[0]


@pytest.mark.parametrize("overlap", [512, 4096])
def test_a_chunk_overlap_not_below_max_seq_length_is_one_error(overlap):
    error = only(check(local(max_seq_length=512, cpt_chunk_overlap=overlap)), "cpt_chunk_overlap")
    assert f"cpt_chunk_overlap={overlap} must be below max_seq_length=512" in error


def test_a_negative_chunk_overlap_is_one_error():
    assert "cpt_chunk_overlap=-1 must be >= 0" in only(check(local(cpt_chunk_overlap=-1)), "cpt_chunk_overlap")


@pytest.mark.parametrize("threshold", [1.5, -0.1])
def test_a_near_dedup_threshold_outside_zero_to_one_is_one_error(threshold):
    error = only(check(local(near_dedup_threshold=threshold)), "near_dedup_threshold")
    assert f"near_dedup_threshold={threshold} must be >= 0 and <= 1" in error


@pytest.mark.parametrize(
    "over", [{"cpt_chunk_overlap": 511, "near_dedup_threshold": 1.0}, {"near_dedup_threshold": 0.8}]
)
def test_an_overlap_below_the_chunk_and_a_threshold_in_range_pass(over):
    assert check(local(max_seq_length=512, **over)) == []


def test_object_store_sources_are_the_data_steps_to_read_even_on_a_local_run():
    # validate_inputs cannot list a bucket (no credentials in its pod); the data step reads it (sources.py).
    assert check(local(cpt_dataset_source="s3://corpus/ko-web/", dataset_source="gs://team/chats.jsonl.gz")) == []


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("data_shards", 0, "data_shards=0 must be >= 1 and <= 256"),
        ("data_shards", 257, "data_shards=257 must be >= 1 and <= 256"),
        ("num_proc", -1, "num_proc=-1 must be >= 0"),
        ("filter_max_duplicate_line_fraction", 1.5, "filter_max_duplicate_line_fraction=1.5 must be >= 0 and <= 1"),
        ("filter_min_chars", -5, "filter_min_chars=-5 must be >= 0"),
    ],
)
def test_corpus_settings_out_of_bounds_are_one_error_each(setting, value, message):
    assert message in only(check(local(**{setting: value})), setting)


def test_a_script_the_filter_does_not_know_is_one_error():
    error = only(check(local(filter_scripts=["hangul", "klingon"])), "filter_scripts")
    assert "klingon" in error and "hangul" in error
