"""Checkpoints, and resuming from them (``--resume RUN_DIR``).

Every ``--checkpoint-every`` rollouts and at the end, each rank writes
``RUN_DIR/checkpoints/rankNNNN.pt``: parameters, the whole Adam state, torch's RNG,
counters, episode statistics, the rollout's pending observations and returns, the
exchange's own state where it keeps one (``--compress topk|powersgd``: this rank's
error-feedback residual, ``exchange.*`` keys), and the
environments' dynamic state where it can be captured exactly (classic-control envs keep
it all in ``unwrapped.state``; other envs are reseeded on resume, and a resumed run is
then no longer bit-identical to an uninterrupted one).  A checkpoint is written to a
temporary file and renamed over the old one, so a crash while writing leaves the
previous checkpoint whole; it holds tensors, numbers and strings only and is read with
``torch.load(weights_only=True)``.

``--resume RUN_DIR`` rebuilds the run from ``RUN_DIR/config.yaml`` (flags on top; earlier
``--fail`` injections are dropped), loads every rank's checkpoint, cuts each rank's HDF5
log back to the checkpoint (rows written after it are discarded, so no update appears
twice) and continues to the same total budget.

Async and quorum runs checkpoint in *generations* (see :mod:`mpirl.designs.paramserver`
for the snapshot protocol): generation G of rank R is
``RUN_DIR/checkpoints/gNNNNNN/rankNNNN.pt``, written atomically like the above.  The
ranks of one generation write at different moments, so a crash can leave the newest
generation incomplete; the parameter server deletes a generation only once a newer one
is known to be complete on every rank, and a resume takes the newest generation that
every rank has (:func:`latest_complete`) and deletes the incomplete ones after it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol


CHECKPOINT_DIR = "checkpoints"


class Stateful(Protocol):
    """A part of a rank whose state a checkpoint keeps: ``state()`` gives a dict of
    tensors, numbers and strings under keys of its own; ``load_state(state)`` takes its
    keys back out of a whole checkpoint."""

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...


class TrainingState:
    """Everything one rank's checkpoint holds: its stateful parts, merged into one flat
    dict (the file's format; no key may come from two parts), and put back part by part.

    >>> TrainingState(learner, actor, episodes, counters).save(run_dir, rank)
    """

    def __init__(self, *parts: Stateful) -> None:
        self.parts = parts

    def state(self) -> dict:
        out: dict = {}
        for part in self.parts:
            mine = part.state()
            clash = out.keys() & mine.keys()
            if clash:
                raise KeyError(f"{type(part).__name__} saves {sorted(clash)}, which another "
                               "part of the checkpoint saves too")
            out.update(mine)
        return out

    def load_state(self, state: dict) -> None:
        for part in self.parts:
            part.load_state(state)

    def save(self, run_dir: Path, rank: int, generation: int | None = None) -> None:
        save(run_dir, rank, self.state(), generation)

    def restore(self, run_dir: Path, rank: int, generation: int | None = None) -> dict:
        """Load this rank's checkpoint into every part; returns the whole checkpoint."""
        state = load(run_dir, rank, generation)
        self.load_state(state)
        return state


def as_tensors(arrays: dict) -> dict:
    """``arrays`` with its numpy arrays as tensors sharing their memory (a checkpoint
    holds tensors, numbers and strings only); other values as they are."""
    import numpy as np
    import torch

    return {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for key, value in arrays.items()}


def as_arrays(tensors: dict) -> dict:
    """What :func:`as_tensors` made, back as numpy arrays."""
    import torch

    return {key: value.numpy() if isinstance(value, torch.Tensor) else value
            for key, value in tensors.items()}


def path_for(run_dir: Path, rank: int, generation: int | None = None) -> Path:
    """Rank ``rank``'s checkpoint file: sync's own, or that of an async/quorum generation."""
    if generation is None:
        return Path(run_dir) / CHECKPOINT_DIR / f"rank{rank:04d}.pt"
    return generation_dir(run_dir, generation) / f"rank{rank:04d}.pt"


def generation_dir(run_dir: Path, generation: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"g{generation:06d}"


def generations(run_dir: Path) -> list[int]:
    """The generations with a directory, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in root.iterdir()
                  if p.is_dir() and p.name[:1] == "g" and p.name[1:].isdigit())


def complete(run_dir: Path, generation: int, world_size: int) -> bool:
    """Every rank of a ``world_size`` run wrote its file of ``generation`` (and no other
    rank did: a generation of a larger run is no checkpoint of this one)."""
    names = {p.name for p in generation_dir(run_dir, generation).glob("rank*.pt")}
    return names == {f"rank{r:04d}.pt" for r in range(world_size)}


def latest_complete(run_dir: Path, world_size: int) -> int | None:
    """The newest generation that every one of ``world_size`` ranks has written."""
    done = [g for g in generations(run_dir) if complete(run_dir, g, world_size)]
    return done[-1] if done else None


def remove_generations(run_dir: Path, keep) -> None:
    """Delete every generation ``g`` for which ``keep(g)`` is false."""
    import shutil

    for g in generations(run_dir):
        if not keep(g):
            shutil.rmtree(generation_dir(run_dir, g), ignore_errors=True)


def save(run_dir: Path, rank: int, state: dict, generation: int | None = None) -> None:
    """Write ``state`` atomically (temporary file, fsync, rename)."""
    import torch

    path = path_for(run_dir, rank, generation)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pt.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)       # the previous checkpoint stays whole
        raise


def load(run_dir: Path, rank: int, generation: int | None = None) -> dict:
    import torch

    path = path_for(run_dir, rank, generation)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint {path}: was the run started with "
                                "--checkpoint-every > 0, and with as many ranks?")
    return torch.load(path, weights_only=True)


class UnusableCheckpoints(ValueError):
    """A run directory's checkpoints cannot continue the run; the message says why."""


def check_set(run_dir: Path, world_size: int, *, same_update: bool,
              generational: bool = False) -> int | None:
    """The update a resume of ``run_dir`` at ``world_size`` ranks continues from (None
    when the checkpoints do not record one), after loading every rank's checkpoint.

    ``--resume`` itself only looks for a file per rank; a launcher deciding on its own
    to resume (``mpirl.sweep``) must also know that the files are whole and belong
    together, or it would start a job that fails or, worse, continues from a mix.
    Raises :class:`UnusableCheckpoints` naming the first problem: a rank's checkpoint
    missing or unreadable (truncated, not a checkpoint), one written by a run with a
    different rank count (or recording none), or, with ``same_update`` (sync, where
    all ranks stop at the same update), ranks at different updates (or, where the files
    record it, rollouts: sync-replay's warm-up rollouts all end at update 0): a job
    killed while its ranks were writing, whose replicas would resume apart."""
    import torch

    generation = None
    if generational:                  # async/quorum: the newest generation all ranks wrote
        generation = latest_complete(run_dir, world_size)
        if generation is None:
            raise UnusableCheckpoints(f"no checkpoint generation written by all "
                                      f"{world_size} ranks")
    updates, rollouts = [], []
    for rank in range(world_size):
        path = path_for(run_dir, rank, generation)
        if not path.is_file():
            raise UnusableCheckpoints(f"no checkpoint for rank {rank} ({path.name})")
        try:
            state = torch.load(path, weights_only=True)
        except Exception as err:          # truncated, garbage, or not torch's format
            raise UnusableCheckpoints(unreadable(path, err)) from None
        recorded = state.get("world_size") if isinstance(state, dict) else None
        if recorded is None:
            raise UnusableCheckpoints(f"{path.name} records no world size")
        if recorded != world_size:
            raise UnusableCheckpoints(f"{path.name} was written by a run of {recorded} "
                                      f"ranks, not {world_size}")
        updates.append(state.get("update", state.get("version")))
        rollouts.append(state.get("rollouts"))
    at = apart(list(zip(updates, rollouts, strict=True)))
    if same_update and at:
        raise UnusableCheckpoints(f"the ranks' checkpoints are of different updates ({at})")
    return updates[0] if isinstance(updates[0], int) else None


def one_line(err: BaseException) -> str:
    """An error as its type and first sentence (torch's messages go on for lines)."""
    first = (str(err).strip().splitlines() or [""])[0].split(". ")[0][:300]
    return f"{type(err).__name__}: {first}"


def unreadable(path: Path, err: BaseException) -> str:
    """That ``path`` cannot be read, in one line."""
    return f"{path.name} cannot be read ({one_line(err)})"


def put_back(saved, state: dict) -> str:
    """``saved.load_state(state)`` (a :class:`TrainingState`'s): "" when every part took
    its state, else the part's own refusal in one line (its type and message, told
    whole: it names what does not fit), for the ranks to agree on before going on."""
    try:
        saved.load_state(state)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return ""


def apart(positions: list[tuple]) -> str:
    """Each rank's (update, rollout or None) in words when the ranks' checkpoints are not
    all of one, else "": "rank 0: update 80 (rollout 80), rank 1: update 40 (rollout 40)"."""
    if len(set(positions)) <= 1:
        return ""
    return ", ".join(f"rank {r}: update {u}" + ("" if n is None else f" (rollout {n})")
                     for r, (u, n) in enumerate(positions))
