"""A complete checkpoint is resumed from only when it is readable: every file the COMPLETE marker records is there
with its recorded size, safetensors headers parse and cover their data, torch's zip files end with their central
directory. An unreadable one is skipped with a warning naming it, and the previous complete one is used."""

import logging

import pytest
import torch
from safetensors.torch import save_file

from components.models.checkpoint_dirs import (
    MARKER,
    is_complete,
    latest_complete_checkpoint,
    recorded_sizes,
    unmark_newer,
    unreadable,
    write_marker,
)


def _checkpoint(root, step, *, marker=True):
    """A checkpoint folder as the Trainer writes one (weights, optimizer, RNG, state), with the new marker."""
    path = root / f"checkpoint-{step}"
    path.mkdir()
    save_file({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8)}, str(path / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.ones(256)}}}, path / "optimizer.pt")
    torch.save({"python": 1}, path / "rng_state_0.pth")
    (path / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    (path / "global_step4").mkdir()  # DeepSpeed's shard folder: files below the checkpoint count too
    torch.save({"module": torch.zeros(16)}, path / "global_step4" / "mp_rank_00_model_states.pt")
    if marker:
        write_marker(path, step)
    return path


def _truncate(path, keep: float = 0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_the_marker_records_every_file_size_and_still_says_its_step(tmp_path):
    path = _checkpoint(tmp_path, 4)
    text = (path / MARKER).read_text()
    assert text.splitlines()[0] == "step 4"  # what the marker said before sizes were recorded
    sizes = recorded_sizes(path)
    assert sizes["model.safetensors"] == (path / "model.safetensors").stat().st_size
    assert sizes["global_step4/mp_rank_00_model_states.pt"] > 0
    assert MARKER not in sizes and set(sizes) == {
        "model.safetensors",
        "optimizer.pt",
        "rng_state_0.pth",
        "trainer_state.json",
        "global_step4/mp_rank_00_model_states.pt",
    }
    assert unreadable(path) is None and is_complete(path)


@pytest.mark.parametrize("old", ["step 4\n", ""])
def test_a_marker_written_before_sizes_were_recorded_still_counts(tmp_path, old):
    path = _checkpoint(tmp_path, 4, marker=False)
    (path / MARKER).write_text(old)
    assert recorded_sizes(path) == {} and unreadable(path) is None
    assert latest_complete_checkpoint(str(tmp_path)) == str(path)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("model.safetensors", "model.safetensors"),
        ("optimizer.pt", "optimizer.pt"),
        ("global_step4/mp_rank_00_model_states.pt", "mp_rank_00_model_states.pt"),
    ],
)
def test_a_truncated_file_skips_the_checkpoint_with_a_warning_and_the_previous_one_is_used(tmp_path, caplog, name, why):
    _checkpoint(tmp_path, 4)
    newest = _checkpoint(tmp_path, 8)
    _truncate(newest / name)
    with caplog.at_level(logging.WARNING):
        assert latest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")
    warning = caplog.text
    assert "skipping" in warning and str(newest) in warning and why in warning


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_an_old_marker_checkpoint_is_still_checked_for_readable_headers(tmp_path, name):
    # No sizes recorded (written by an earlier release): the headers alone tell a truncated file.
    _checkpoint(tmp_path, 4)
    newest = _checkpoint(tmp_path, 8, marker=False)
    (newest / MARKER).write_text("step 8\n")
    _truncate(newest / name)
    assert name in unreadable(newest)
    assert latest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")


def test_a_missing_or_resized_file_is_named(tmp_path):
    path = _checkpoint(tmp_path, 4)
    (path / "rng_state_0.pth").unlink()
    assert "rng_state_0.pth is missing" in unreadable(path)
    path = _checkpoint(tmp_path, 8)
    with open(path / "trainer_state.json", "a") as f:
        f.write(" ")
    why = unreadable(path)
    assert "trainer_state.json" in why and "recorded" in why


@pytest.mark.parametrize("content", [b"", b"\x01\x00\x00\x00\x00\x00\x00\x00{", b"\x02\x00\x00\x00\x00\x00\x00\x00[]"])
def test_a_safetensors_file_whose_header_does_not_parse_is_unreadable(tmp_path, content):
    path = _checkpoint(tmp_path, 4, marker=False)
    (path / "model.safetensors").write_bytes(content)
    (path / MARKER).write_text("step 4\n")
    assert "model.safetensors" in unreadable(path)


def test_an_empty_torch_file_is_unreadable(tmp_path):
    path = _checkpoint(tmp_path, 4, marker=False)
    (path / "optimizer.pt").write_bytes(b"")
    (path / MARKER).write_text("step 4\n")
    assert "optimizer.pt" in unreadable(path)


def test_when_no_complete_checkpoint_is_readable_the_run_starts_afresh(tmp_path, caplog):
    only = _checkpoint(tmp_path, 4)
    _truncate(only / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        assert latest_complete_checkpoint(str(tmp_path)) is None
    assert str(only) in caplog.text


def test_checkpoints_newer_than_the_step_resumed_from_are_unmarked_before_their_step_is_written_again(tmp_path):
    _checkpoint(tmp_path, 4)
    skipped = _checkpoint(tmp_path, 8)
    _truncate(skipped / "optimizer.pt")
    assert unmark_newer(str(tmp_path), 4) == [str(skipped)]
    assert not is_complete(skipped) and is_complete(tmp_path / "checkpoint-4")
