"""Where each logged second of an update lies on the time axis: the one layout shared by
the timeline figure (:func:`analysis.figures.timeline_figure`) and the trace export
(``python -m analysis.trace``).

A rank's log row holds an update's start and the seconds of each phase, not when each
phase ran; phases that interleave step by step (env and forward while collecting; an
actor's env steps and its waits for actions) have totals only.  The layout is:

* phases in turn from the update's start, in :data:`ROW_ORDER`;
* where the row records when its exchange began (``exchange_t_s``) and the design's
  phases do not interleave (the gradient and replay designs), the backward pass ends
  at that moment, the exchange starts there (its wait first, then its transfer) and the
  optimizer step follows it: those are measured positions, not laid out;
* every span clipped to the update's own interval ``[t, t + busy]`` (so the spans of one
  phase never overlap from one update to the next), and the exchange's wait and
  transfer to the exchange's.

``other_s`` (bookkeeping) has no span: it is what the update's interval holds beyond
its phases.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mpirl.telemetry.schema import ACTOR_LEARNER_MODES

#: the order phases are laid out in from an update's start
ROW_ORDER = ("env_s", "forward_s", "infer_wait_s", "straggle_s", "send_s", "param_wait_s",
             "batch_wait_s", "reply_s", "data_wait_s", "backward_s", "exchange_s",
             "optimizer_s", "publish_s", "replay_s")
#: the exchange's two parts, laid inside it
EXCHANGE_PARTS = ("wait_s", "transfer_s")
#: phases placed at the measured exchange time where a row has one
ANCHORED = ("backward_s", "exchange_s", "optimizer_s")

#: what each phase is called in figures and traces
PART_LABELS = {"env_s": "env", "forward_s": "forward", "straggle_s": "straggler slowdown",
               "backward_s": "backward", "optimizer_s": "optimizer",
               "other_s": "other (bookkeeping)",
               "wait_s": "exchange: waiting", "transfer_s": "exchange: transfer",
               "exchange_s": "exchange", "infer_wait_s": "actor: waiting for actions",
               "send_s": "sending", "param_wait_s": "actor: waiting for the reply",
               "batch_wait_s": "inference: waiting for a batch", "reply_s": "inference: replying",
               "data_wait_s": "learner: waiting for data", "publish_s": "publishing parameters",
               "replay_s": "replay: insert, sample, priorities"}
COLUMNS = ["run", "rank", "role", "update", "part", "start_s", "end_s", "dur_s"]


def spans(updates: pd.DataFrame, mode: str) -> pd.DataFrame:
    """One row per (update row, phase) with time in it: run, rank, role, update, part
    (a phase column's name, or ``wait_s`` / ``transfer_s`` inside ``exchange_s``),
    ``start_s`` and ``end_s`` (seconds since the run started, as ``t_run_s``) and
    ``dur_s``.  ``updates``
    is a run's ``updates`` table (:func:`mpirl.telemetry.read.load_run`) or part of it."""
    if not len(updates):
        return pd.DataFrame(columns=COLUMNS)
    u = updates
    t = u["t_run_s"].to_numpy()
    end = t + u["busy_s"].to_numpy()
    t0 = (u["t_unix_s"] - u["t_run_s"]).to_numpy()
    ex = u["exchange_unix_s"].to_numpy() - t0
    anchored = np.isfinite(ex) & (mode not in ACTOR_LEARNER_MODES)
    start, at = {}, t.copy()
    for part in ROW_ORDER:
        start[part] = at.copy()
        at = at + u[part].fillna(0.0).to_numpy()
    start["backward_s"] = np.where(anchored, ex - u["backward_s"].to_numpy(),
                                   start["backward_s"])
    start["exchange_s"] = np.where(anchored, ex, start["exchange_s"])
    start["optimizer_s"] = np.where(anchored, ex + u["exchange_s"].to_numpy(),
                                    start["optimizer_s"])
    start["wait_s"] = start["exchange_s"]
    start["transfer_s"] = start["exchange_s"] + u["wait_s"].fillna(0.0).to_numpy()
    frames, bounds = [], {}
    for part in (*ROW_ORDER, *EXCHANGE_PARTS):
        dur = u[part].fillna(0.0).to_numpy()
        inside = bounds["exchange_s"] if part in EXCHANGE_PARTS else (t, end)
        lo = np.clip(start[part], *inside)
        hi = np.clip(start[part] + dur, *inside)
        bounds[part] = (lo, hi)
        keep = hi > lo
        frames.append(pd.DataFrame({
            "run": u["run"].to_numpy()[keep], "rank": u["rank"].to_numpy()[keep],
            "role": u["role"].to_numpy()[keep], "update": u["update"].to_numpy()[keep],
            "part": part, "start_s": lo[keep], "end_s": hi[keep], "dur_s": (hi - lo)[keep]}))
    return pd.concat(frames, ignore_index=True)
