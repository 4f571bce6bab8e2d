"""TrainingState: one flat dict from its parts, back to every part, through atomic files."""

from __future__ import annotations

import pytest
import torch

from mpirl.resilience import checkpoint
from mpirl.resilience.checkpoint import TrainingState


class Part:
    """A stateful part that saves its own keys and records what it was handed back."""

    def __init__(self, **values):
        self.values = values
        self.loaded: list[dict] = []

    def state(self) -> dict:
        return dict(self.values)

    def load_state(self, state: dict) -> None:
        self.loaded.append(state)
        self.values = {key: state[key] for key in self.values}


def parts():
    return (Part(params=torch.arange(4.0), update=7),
            Part(torch_rng=torch.get_rng_state(), envs='[{"state": [0.1]}]'),
            Part(counts={"steps": 12, "episodes": 3}, staleness=torch.tensor([0, 2, 1])))


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        if torch.is_tensor(a[key]):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_state_merges_every_part():
    a, b, c = parts()
    state = TrainingState(a, b, c).state()
    assert set(state) == {"params", "update", "torch_rng", "envs", "counts", "staleness"}
    assert state["update"] == 7 and state["envs"] == b.values["envs"]


def test_a_key_saved_by_two_parts_raises_naming_it():
    with pytest.raises(KeyError, match="update"):
        TrainingState(Part(update=1, a=2), Part(b=3), Part(update=4)).state()


def test_load_state_hands_the_whole_dict_to_every_part():
    a, b, c = parts()
    whole = TrainingState(a, b, c).state()
    TrainingState(a, b, c).load_state(whole)
    for part in (a, b, c):
        assert part.loaded == [whole] and part.loaded[0] is whole


def test_put_back_gives_a_parts_refusal_in_one_line_or_nothing():
    a, b, c = parts()
    whole = TrainingState(a, b, c).state()
    assert checkpoint.put_back(TrainingState(a, b, c), whole) == ""
    refused = checkpoint.put_back(TrainingState(Part(missing=1)), whole)
    assert refused == "KeyError: 'missing'"


def test_save_and_restore_round_trip(tmp_path):
    saved = TrainingState(*parts())
    saved.save(tmp_path, rank=3)
    path = tmp_path / "checkpoints" / "rank0003.pt"
    assert path.is_file() and checkpoint.path_for(tmp_path, 3) == path
    assert_same(torch.load(path, weights_only=True), saved.state())
    fresh = (Part(params=None, update=None), Part(torch_rng=None, envs=None),
             Part(counts=None, staleness=None))
    whole = TrainingState(*fresh).restore(tmp_path, rank=3)
    assert_same(whole, saved.state())
    for mine, theirs in zip(fresh, saved.parts, strict=True):
        assert_same(mine.values, theirs.values)


def test_a_generation_is_saved_in_its_own_directory(tmp_path):
    TrainingState(Part(version=5)).save(tmp_path, rank=1, generation=12)
    path = tmp_path / "checkpoints" / "g000012" / "rank0001.pt"
    assert path.is_file()
    assert checkpoint.generations(tmp_path) == [12]
    assert torch.load(path, weights_only=True) == {"version": 5}
    assert TrainingState(Part(version=0)).restore(tmp_path, 1, generation=12) == {"version": 5}


def test_restore_without_a_file_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="rank0002.pt"):
        TrainingState(Part(x=1)).restore(tmp_path, rank=2)


def test_save_replaces_the_old_file_and_leaves_no_temporary(tmp_path):
    TrainingState(Part(update=1)).save(tmp_path, 0)
    TrainingState(Part(update=2)).save(tmp_path, 0)
    assert torch.load(checkpoint.path_for(tmp_path, 0), weights_only=True) == {"update": 2}
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["rank0000.pt"]


def test_a_crash_while_writing_leaves_the_old_checkpoint_whole(tmp_path, monkeypatch):
    TrainingState(Part(update=1)).save(tmp_path, 0)

    def half_written(obj, f):
        f.write(b"\x80\x02garbage")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        TrainingState(Part(update=2)).save(tmp_path, 0)
    monkeypatch.undo()
    assert torch.load(checkpoint.path_for(tmp_path, 0), weights_only=True) == {"update": 1}


def test_save_syncs_before_it_renames(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = checkpoint.os.fsync, checkpoint.os.replace
    monkeypatch.setattr(checkpoint.os, "fsync",
                        lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(checkpoint.os, "replace",
                        lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    TrainingState(Part(update=1)).save(tmp_path, 0)
    assert events == ["fsync", "replace"]
