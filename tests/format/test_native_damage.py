"""What a reader does with each kind of damage to the native store (docs/format.md §5.1)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import tensortap as tt
from tensortap.exceptions import CorruptData, NoMoreData, UnsupportedFormatVersion
from tensortap.format import codec
from tensortap.format.native import NativeSource
from tensortap.storage import LocalStorage
from tensortap.trials import Trial

STEPS = 7


def _job(path, steps: int = STEPS) -> None:
    """Block i holds step i: `w` (a .dat payload) and `loss` (inline); the last one also the end mark."""
    hook = tt.Hook(str(path), save_config=tt.SaveConfig(save_interval=1), flush_interval=60)
    for s in range(steps):
        hook.next_step()
        hook.save_tensor("w", np.full((4, 8), s, dtype=np.float32))
        hook.save_scalar("loss", float(s))
        if s < steps - 1:
            hook.flush()
    hook.close()


def _files(path, suffix: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(suffix))


def block_spans(data: bytes) -> list[tuple[int, int, dict]]:
    """(offset, end, header) of every block of an intact index."""
    dec = codec.decode_blocks(data, 0, "x", final=True)
    assert not dec.damage
    ends = [at for _, _, at in dec.blocks[1:]] + [len(data)]
    return [(at, end, h) for (h, _, at), end in zip(dec.blocks, ends, strict=True)]


def _flip(path: str, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))


def _trial(path, settle_s: float = 0.3) -> Trial:
    return Trial(NativeSource(LocalStorage(str(path)), settle_s=settle_s), "t")


def _readable_steps(trial: Trial) -> list[int]:
    return trial.tensor("w").steps(show_incomplete_steps=True) if trial.has_tensor("w") else []


def test_bad_block_costs_that_block_only(tmp_path, caplog):
    _job(tmp_path)
    idx = _files(tmp_path, ".idx")[0]
    with open(idx, "rb") as f:
        spans = block_spans(f.read())
    assert len(spans) == STEPS
    victim = spans[5][0]  # block 6 of 7: step 5
    _flip(idx, victim + 16 + 3)  # inside its JSON header
    with caplog.at_level(logging.WARNING, logger="tensortap"):
        trial = _trial(tmp_path)
        trial.steps()
        trial.refresh_data()
        trial.refresh_data()
    steps = _readable_steps(trial)
    assert steps == [0, 1, 2, 3, 4, 6], "the intact blocks before and after the damaged one stay readable"
    assert trial.tensor("scalar/loss").steps() == [0, 1, 2, 3, 4, 6]
    for s in steps:
        assert np.array_equal(trial.tensor("w").value(s), np.full((4, 8), s, dtype=np.float32))
    assert [(d.path, d.offset) for d in trial.damage] == [(idx, victim)]
    assert "checksum" in trial.damage[0].reason
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warnings) == 1 and idx in warnings[0] and f"offset {victim}" in warnings[0]
    assert "step 5 of worker worker_0 lost" in warnings[0] and trial.damage[0].lost == "step 5 of worker worker_0 lost"
    assert trial.loaded_all_steps  # the end mark is in an intact block


def test_trailing_garbage_is_reported_and_the_rest_readable(tmp_path):
    _job(tmp_path)
    idx = _files(tmp_path, ".idx")[0]
    size = os.path.getsize(idx)
    with open(idx, "ab") as f:
        f.write(np.random.default_rng(3).integers(0, 256, 1000, dtype=np.uint8).tobytes())
    trial = tt.create_trial(str(tmp_path))
    assert trial.steps() == list(range(STEPS))
    assert trial.loaded_all_steps
    assert [(d.path, d.offset) for d in trial.damage] == [(idx, size)]
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([STEPS + 3], timeout=5)


@pytest.mark.parametrize("where", ["json", "entries", "crc", "size"])
def test_damaged_last_block_is_reported_and_the_job_still_ends(tmp_path, where):
    _job(tmp_path)
    idx = _files(tmp_path, ".idx")[0]
    with open(idx, "rb") as f:
        spans = block_spans(f.read())
    at, end, header = spans[-1]
    assert header.get("end") is True
    hlen = end - at - 16 - 2 * codec.DISK_ENTRY_DTYPE.itemsize  # two entries: w and loss
    offset = {"json": at + 16 + 2, "entries": at + 16 + hlen + 20, "crc": at + 12, "size": at + 6}[where]
    _flip(idx, offset, bit=3 if where == "size" else 0)
    trial = _trial(tmp_path)
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([STEPS + 5], timeout=30)
    assert trial.loaded_all_steps
    assert [d.offset for d in trial.damage] == [at] and trial.damage[0].path == idx
    assert _readable_steps(trial) == list(range(STEPS - 1))  # every step of an intact block


def test_flipped_magic_is_damage_not_a_newer_version(tmp_path):
    _job(tmp_path)
    idx = _files(tmp_path, ".idx")[0]
    with open(idx, "rb") as f:
        spans = block_spans(f.read())
    _flip(idx, spans[2][0] + 3, bit=1)  # TTB1 -> TTB3
    trial = tt.create_trial(str(tmp_path))
    assert [d.offset for d in trial.damage] == [spans[2][0]] and "magic" in trial.damage[0].reason
    assert _readable_steps(trial) == [0, 1, 3, 4, 5, 6]


def test_a_newer_block_version_is_refused(tmp_path):
    _job(tmp_path, steps=1)
    idx = _files(tmp_path, ".idx")[0]
    with open(idx, "ab") as f:
        f.write(b"TTB2" + (2).to_bytes(4, "little") + bytes(4) + (12345).to_bytes(4, "little") + b"{}")
    with pytest.raises(UnsupportedFormatVersion, match="TTB2"):
        tt.create_trial(str(tmp_path))


def test_truncated_index_of_a_finished_chunk(tmp_path):
    _job(tmp_path)
    idx = _files(tmp_path, ".idx")[0]
    with open(idx, "rb") as f:
        spans = block_spans(f.read())
    cut = spans[-2][0] + 20  # inside the block before the last
    with open(idx, "r+b") as f:
        f.truncate(cut)
    trial = _trial(tmp_path)
    # the torn tail is pending at first (a block being written looks the same) ...
    assert not trial.loaded_all_steps and trial.damage == []
    # ... and final once the file has not grown for settle_s: reported, and the worker seen as ended
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([STEPS + 5], timeout=30)
    assert [(d.path, d.offset) for d in trial.damage] == [(idx, spans[-2][0])]
    assert "truncated" in trial.damage[0].reason
    assert _readable_steps(trial) == list(range(STEPS - 2))


def test_corrupt_and_truncated_and_missing_payloads(tmp_path):
    _job(tmp_path)
    dat = _files(tmp_path, ".dat")[0]
    trial = tt.create_trial(str(tmp_path))
    e = trial.tensor("w")._part((0, 255))
    off3 = int(e[e["step"] == 3][0]["offset"])
    _flip(dat, off3 + 1)
    trial = tt.create_trial(str(tmp_path))
    with pytest.raises(CorruptData) as ei:
        trial.tensor("w").value(3)
    assert ei.value.path == dat and ei.value.offset == off3 and "checksum" in str(ei.value)
    for s in (0, 1, 2, 4, 5, 6):
        assert np.array_equal(trial.tensor("w").value(s), np.full((4, 8), s, dtype=np.float32))
    assert trial.tensor("scalar/loss").value(3) == 3.0  # inline values do not depend on the .dat
    off5 = int(e[e["step"] == 5][0]["offset"])
    with open(dat, "r+b") as f:
        f.truncate(off5 + 10)
    trial = tt.create_trial(str(tmp_path))
    with pytest.raises(CorruptData, match="truncated") as ei:
        trial.tensor("w").value(5)
    assert ei.value.path == dat and ei.value.offset == off5
    assert np.array_equal(trial.tensor("w").value(4), np.full((4, 8), 4, dtype=np.float32))
    os.unlink(dat)
    trial = tt.create_trial(str(tmp_path))
    assert trial.steps() == list(range(STEPS))
    with pytest.raises(CorruptData, match="missing") as ei:
        trial.tensor("w").value(0)
    assert ei.value.path == dat
    with pytest.raises(CorruptData, match="missing"):
        trial.tensor("w").stacked()
    assert trial.tensor("scalar/loss").value(2) == 2.0


def test_malformed_but_checksummed_block_is_damage(tmp_path):
    """A block whose checksum is right but whose tables do not fit its entries (a writer bug)."""
    _job(tmp_path, steps=2)
    idx = _files(tmp_path, ".idx")[0]
    entries = np.zeros(1, dtype=codec.DISK_ENTRY_DTYPE)
    entries["name"] = 7  # no such name
    entries["mode"] = 1
    with open(idx, "ab") as f:
        f.write(codec.encode_block({"names": ["x"], "dtypes": ["<f4"], "shapes": [[]]}, entries))
        f.write(codec.encode_block({"names": ["x"], "dtypes": ["<f4"], "shapes": [[]], "passed": "soon"},
                                   np.empty(0, dtype=codec.DISK_ENTRY_DTYPE)))
    trial = tt.create_trial(str(tmp_path))
    assert trial.steps() == [0, 1]
    assert len(trial.damage) == 2 and all("malformed" in d.reason for d in trial.damage)
