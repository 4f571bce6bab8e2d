"""The log schema: every table mpirl writes, shared by the writer and every reader.

Layout of a run directory:

``run.h5`` (written by rank 0)
    attrs: ``schema`` (int), ``mpirl_version``, ``git_commit``, ``mpi_library``,
    ``world_size``, ``mode``, ``topology``, ``env``, ``config_json`` (the resolved
    configuration), ``hostnames_json`` (one per rank), ``cores_per_node_json``,
    ``oversubscribed`` (bool: ranks outnumbered cores on some node; timings suspect),
    ``scheduler_json`` (Slurm job id, name, nodes... when run under Slurm; else ``{}``),
    ``cluster_json`` (``ranks_on``: ranks per host; on an emulated cluster also its
    ``name``, the job's ``nodes``, the link cap ``rate``, ``ranks_per_node``,
    ``placement``, ``mpi``),
    ``start_unix_s``, ``attempts_json`` (each start of the run, the first and every
    resume: ``start_unix_s``, ``from_update``, ``hostnames``, ``cores_per_node``,
    ``scheduler``, ``cluster``; the top-level host, scheduler and cluster attrs are the
    first start's), ``end_unix_s`` (absent if the run did not finish),
    ``gradients_sent`` / ``gradients_applied`` / ``gradients_dropped`` (at the end),
    ``ranks_failed_json`` (launch ranks lost and survived, ``--on-failure shrink``).
    At the end these are written by the lowest surviving rank.
    ``/ranks/NNNN``: an HDF5 external link to ``rankNNNN.h5:/`` for every rank, so
    analysis opens this one file and reaches every rank's data.

``rankNNNN.h5`` (written by rank NNNN alone; no traffic between ranks)
    attrs: ``rank``, ``hostname``, ``role`` (``worker``, ``server``, ``actor``,
    ``learner``, ``predictor``, ``replay``), ``start_unix_s``,
    ``schema``.
    ``updates``: one row per update this rank took part in (:data:`UPDATE_DTYPE`).
    ``episodes``: one row per finished episode (:data:`EPISODE_DTYPE`).
    ``sim_steps``: one row per env step, for envs that time their simulator
    (:data:`SIM_STEP_DTYPE`; empty otherwise).
    ``failures``: one row per rank failure this rank survived (:data:`FAILURE_DTYPE`).

Times are seconds; ``t_s`` columns count from the rank's ``start_unix_s``.

Every table's fill value (:func:`fill_row`) marks rows that were allocated but never
written (``update`` -1): readers drop them (:func:`written`).

Schema history: 2 added ``exchange_t_s``, ``wait_s`` and ``other_s``; 3 the
``failures`` table; 4 the losses of every update (``policy_loss``, ``value_loss``,
``entropy``, ``approx_kl``), the fill values, and files that a crash leaves readable by
any HDF5 reader (:mod:`mpirl.telemetry.h5log`); 5 the actor-learner designs' phases by
role and their lag, queue, batch and round-trip columns; 6 the replay designs (apex,
gorila): the ``replay`` role, its ``replay_s`` phase, and the ``inserted``, ``sampled``,
``prio_updates`` and ``replay_size`` columns.
"""

from __future__ import annotations

import numpy as np

from .. import registry

SCHEMA_VERSION = 6
#: the oldest schema the readers still read (older files lack some columns: NaN or -1)
OLDEST_READABLE = 1

#: per-update record; ``-1`` where an integer field does not apply (e.g. staleness in sync
#: mode), NaN where a float one does not (the losses of a server's row).
UPDATE_DTYPE = np.dtype([
    ("update", "i8"),          # this rank's update counter (server: parameter version)
    ("t_s", "f8"),             # start of the update, seconds since the rank's start
    ("env_s", "f8"),           # stepping environments
    ("forward_s", "f8"),       # policy/value inference while collecting
    ("straggle_s", "f8"),      # injected slowdown (--straggler)
    ("backward_s", "f8"),      # loss and backward pass
    ("exchange_s", "f8"),      # the topology call (waiting for others + moving data)
    ("exchange_t_s", "f8"),    # when the exchange began, seconds since the rank's start
    ("wait_s", "f8"),          # part of exchange_s spent waiting for a peer's message;
                               # NaN where the topology cannot tell (collectives: analysis
                               # derives it from every rank's exchange_t_s)
    ("optimizer_s", "f8"),     # clipping and the optimizer step
    ("other_s", "f8"),         # the rest of the update: rollout bookkeeping, advantages,
                               # progress reports (t_s + all phases = the next row's t_s
                               # minus that row's log_s: every second is in some column)
    ("bytes_sent", "i8"),      # by this rank's topology calls during the update
    ("bytes_recv", "i8"),
    ("env_steps", "i8"),       # env steps this rank collected for the update
    ("param_version", "i8"),   # version of the parameters the gradient was computed on
    ("staleness", "i8"),       # server: version applied minus version computed on
    ("dropped", "i8"),         # server: 1 if this gradient was dropped, not applied
    ("log_s", "f8"),           # time this rank spent logging the previous row (overhead)
    ("policy_loss", "f8"),     # schema 4: the losses of the gradient computed for this
    ("value_loss", "f8"),      # update (before averaging with other ranks'); NaN on a
    ("entropy", "f8"),         # server, which computes none
    ("approx_kl", "f8"),       # E[(r - 1) - log r], r = pi/pi_old: PPO's clipped
                               # objective only (--clip-ratio > 0), else NaN; V-trace
                               # designs: the learner's policy against the behaviour one
    # schema 5: the actor-learner designs (impala, seed, ga3c).  Phases by role:
    ("infer_wait_s", "f8"),    # actor: waiting for actions from the inference rank
    ("send_s", "f8"),          # actor: sending (an unroll; a request's part not waited)
    ("param_wait_s", "f8"),    # actor: waiting for the learner's reply to an unroll
                               # (impala --param-delivery broadcast: and copying in the
                               # newest broadcast, which its thread received meanwhile)
    ("batch_wait_s", "f8"),    # inference: waiting for requests to fill a batch
    ("reply_s", "f8"),         # inference: sending actions back
    ("data_wait_s", "f8"),     # learner: waiting for unrolls
    ("publish_s", "f8"),       # learner: sending parameters (to actors or a predictor)
    ("policy_lag", "f8"),      # learner: mean over the update's unrolls of (version at
                               # use - version that produced it); actor: lag of the
                               # parameters it acted with when its unroll was taken
    ("policy_lag_max", "i8"),  # learner: the largest of them
    ("queue_len", "i8"),       # learner: unrolls waiting when the update began
    ("batch_size", "f8"),      # inference: mean observations per forward pass
    ("rtt_s", "f8"),           # seed/ga3c actor: mean round trip of a step's request
    # schema 6: the replay designs (apex, gorila)
    ("replay_s", "f8"),        # replay rank: inserting, sampling, updating priorities
    ("inserted", "i8"),        # replay rank, gorila worker: transitions inserted
    ("sampled", "i8"),         # transitions sampled (replay rank; learner: its batch)
    ("prio_updates", "i8"),    # priorities set (replay rank: applied; learner: sent)
    ("replay_size", "i8"),     # transitions stored after the row
])
PHASES = ("env_s", "forward_s", "straggle_s", "backward_s", "exchange_s", "optimizer_s",
          "infer_wait_s", "send_s", "param_wait_s", "batch_wait_s", "reply_s",
          "data_wait_s", "publish_s", "replay_s", "other_s")
#: the roles of ranks that step environments (their rows carry env steps and episodes)
EXPERIENCE_ROLES = registry.EXPERIENCE_ROLES
#: the designs whose unrolls carry a parameter version (policy_lag.npy, lag columns)
ACTOR_LEARNER_MODES = registry.modes(lagged=True)
#: what an update row holds where its writer gives no value (0 for every other field)
UPDATE_UNSET = {"param_version": -1, "staleness": -1, "exchange_t_s": np.nan,
                "wait_s": np.nan, "policy_loss": np.nan, "value_loss": np.nan,
                "entropy": np.nan, "approx_kl": np.nan, "policy_lag": np.nan,
                "policy_lag_max": -1, "queue_len": -1, "batch_size": np.nan, "rtt_s": np.nan,
                "inserted": -1, "sampled": -1, "prio_updates": -1, "replay_size": -1}
#: the loss columns, in the order :func:`mpirl.parts.learner.losses.actor_critic_loss`
#: reports them
LOSSES = ("policy_loss", "value_loss", "entropy", "approx_kl")

EPISODE_DTYPE = np.dtype([
    ("update", "i8"),          # the update (sync) or push (async/quorum worker) whose
                               # rollout the episode ended in
    ("t_s", "f8"),
    ("return", "f8"),
    ("length", "i8"),
])

#: one row per environment step of an env that reports its simulation time
#: (``info["sim_s"]``: L2Run-v0, Delay-v0), so stragglers' causes can be seen step by step
SIM_STEP_DTYPE = np.dtype([
    ("update", "i8"),          # the update whose rollout took the step
    ("env", "i8"),             # which of the rank's envs
    ("sim_s", "f8"),           # seconds inside the simulator (summed over action repeats)
])

#: one row per failure this rank survived (``--on-failure shrink``): what it saw, how
#: long detection and recovery took, and who was left
FAILURE_DTYPE = np.dtype([
    ("update", "i8"),          # the update whose exchange saw the failure (or, seen in a
                               # collective after it: a checksum, the stop check, that one)
    ("t_s", "f8"),             # when recovery ended, seconds since the rank's start
    ("unix_s", "f8"),          # the same, wall clock (to compare with a kill's time)
    ("detect_s", "f8"),        # from entering the failed operation to the error
    ("recover_s", "f8"),       # revoke + shrink + agreement + topology rebuild
    ("size_after", "i8"),      # ranks left
    ("failed", "S64"),         # launch ranks lost, comma-separated
])

#: every table of a rank file, in file order
TABLES = (("updates", UPDATE_DTYPE), ("episodes", EPISODE_DTYPE),
          ("sim_steps", SIM_STEP_DTYPE), ("failures", FAILURE_DTYPE))


def fill_row(dtype: np.dtype) -> np.ndarray:
    """The fill value of a table: ``update`` (and every integer) -1, every float NaN,
    strings empty.  A row reads as this when a writer was killed in the middle of
    appending it (see :mod:`mpirl.telemetry.h5log`); no row ever written has update -1."""
    row = np.zeros((), dtype=dtype)
    for name in dtype.names:
        kind = dtype[name].kind
        row[name] = -1 if kind == "i" else np.nan if kind == "f" else row[name]
    return row


def written(rows: np.ndarray) -> np.ndarray:
    """``rows`` without the fill rows a kill in the middle of a flush can leave."""
    return rows[rows["update"] != -1] if len(rows) else rows

# -- microbenchmark results (python -m mpirl.bench --out FILE.h5) ------------------------------
#: one row per (topology, message size) of a benchmark run; latencies are each rank's mean
#: over the timed calls, reduced over ranks (the best of the rounds by average).
BENCH_DTYPE = np.dtype([
    ("op", "S16"),             # allreduce or bcast
    ("topology", "S160"),      # a topology spec (hierarchical:ring:2, auto:PATH); native:ALGO
                               # for MPICH with a forced algorithm (older files: S48)
    ("bytes", "i8"),           # message size
    ("iters", "i8"),           # timed calls per round
    ("min_s", "f8"),
    ("avg_s", "f8"),
    ("max_s", "f8"),
])
BENCH_KIND = "mpirl.bench"


def upgrade(rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rows of an older schema as ``dtype``: fields it lacks are NaN (floats) or -1."""
    if rows.dtype == dtype:
        return rows
    out = np.empty(len(rows), dtype=dtype)
    for name in dtype.names:
        if name in rows.dtype.names:
            out[name] = rows[name]
        else:
            out[name] = np.nan if dtype[name].kind == "f" else -1
    return out
