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
