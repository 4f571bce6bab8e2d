"""``python -m analysis.elastic RUN_DIR/NAME [-o elastic.png]``: an elastic job's attempts
read as one run (docs/faults.md, "Elastic training").

An elastic job (``python -m mpirl.cluster exec --elastic ... -- python -m mpirl.run
--commit-every K``) writes one run directory per attempt, ``NAME/attempt0``,
``NAME/attempt1``, ..., each with its ``elastic.json`` (ranks, nodes, the commit it
continued from).  This prints one row per attempt:

* ``ranks``, ``nodes``; ``updates`` logged (first-last); ``from`` the update it continued
  from (its restored commit), ``lost``: updates the previous attempt had logged past that
  commit (work done again; at most ``--commit-every`` rollouts' updates; a killed
  attempt's log can end an update short of where its ranks died, its last flush dying
  with them, so this counts from the last update its log holds);
* ``gap_s``: from the previous attempt's last logged update to this one's first (the
  relaunch: the job's end, a new launch, imports, the restore); ``restore_s``;
* ``commits``, their mean time and size on the node that wrote rank 0's.

and draws the return per update across attempts (mean over ranks of episodes
finished in that update's rollout, smoothed), the rank count per update, and the wall
clock per update (a relaunch shows as a step; work done again as updates drawn twice).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mpirl.telemetry.read import Run, load_run


@dataclass
class Attempt:
    number: int
    run: Run
    record: dict           # its elastic.json


def load_job(path: str | Path) -> list[Attempt]:
    """The attempts of the elastic job in ``path`` (``NAME/attemptN`` directories), in order."""
    path = Path(path)
    dirs = sorted((p for p in path.glob("attempt*") if (p / "run.h5").is_file()),
                  key=lambda p: int(p.name.removeprefix("attempt") or 0))
    if not dirs:
        raise FileNotFoundError(f"{path}: no attempt directories (attemptN/run.h5): give the "
                                "run directory of an elastic job (RUN_DIR/NAME)")
    out = []
    for d in dirs:
        record_path = d / "elastic.json"
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        out.append(Attempt(int(d.name.removeprefix("attempt")), load_run(d), record))
    return out


def _ends(run: Run) -> pd.Series:
    """Each update's end (unix seconds), the latest rank's."""
    u = run.updates
    return (u["t_unix_s"] + u["busy_s"]).groupby(u["update"]).max()


def attempts_table(job: list[Attempt]) -> pd.DataFrame:
    rows, previous = [], None
    for a in job:
        ends = _ends(a.run)
        restored = (a.record.get("restored") or {})
        frm = restored.get("update")
        row = {"attempt": a.number, "ranks": int(a.run.meta["world_size"]),
               "nodes": ", ".join(a.record.get("hosts", [])),
               "first_update": int(ends.index.min()) if len(ends) else None,
               "last_update": int(ends.index.max()) if len(ends) else None,
               "from_update": frm, "env_steps_from": restored.get("env_steps"),
               "lost_updates": None, "gap_s": None,
               "restore_s": restored.get("seconds"),
               "commits": a.record.get("commits"),
               "commit_ms": (1e3 * a.record["commit_s"] / a.record["commits"]
                             if a.record.get("commits") else None),
               "commit_bytes": a.record.get("commit_bytes")}
        if previous is not None and len(ends):
            prev_ends = _ends(previous.run)
            if frm is not None and len(prev_ends):
                # a killed attempt's last flush may die with it: its log can end an
                # update short of where its ranks were, so this is a lower bound
                row["lost_updates"] = max(0, int(prev_ends.index.max()) - int(frm))
            if len(prev_ends):
                row["gap_s"] = float(ends.iloc[0] - prev_ends.max())
        rows.append(row)
        previous = a
    return pd.DataFrame(rows)


def returns_by_update(run: Run, smooth: int = 20) -> pd.Series:
    e = run.episodes
    if not len(e):
        return pd.Series(dtype=float)
    per = e.groupby("update")["return"].mean()
    return per.rolling(smooth, min_periods=1).mean()


def draw(job: list[Attempt], out: Path, marks: dict[str, float] | None = None) -> None:
    """Three panels against the update: return, ranks, wall clock since the job started.
    ``marks``: label -> unix time of an outside event (a node killed, booted), drawn on
    the clock panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(a.run.updates["t_unix_s"].min() for a in job)
    fig, (ax_r, ax_n, ax_t) = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 1, 2]})
    for a in job:
        color = f"C{a.number}"
        label = f"attempt {a.number}: {int(a.run.meta['world_size'])} ranks"
        r = returns_by_update(a.run)
        ax_r.plot(r.index, r.values, color=color, label=label)
        ends = _ends(a.run)
        ax_n.step([ends.index.min(), ends.index.max()], [a.run.meta["world_size"]] * 2,
                  color=color, where="post", lw=3)
        ax_t.plot(ends.index, ends.values - t0, color=color, label=label)
        frm = (a.record.get("restored") or {}).get("update")
        if frm is not None:
            for ax in (ax_r, ax_n, ax_t):
                ax.axvline(frm, color=color, ls=":", lw=1)
    for name, unix in (marks or {}).items():
        ax_t.axhline(unix - t0, color="k", ls="--", lw=0.8)
        ax_t.annotate(name, (0, unix - t0), xycoords=("axes fraction", "data"),
                      xytext=(4, 3), textcoords="offset points", fontsize=8)
    ax_r.set_ylabel("return (mean over ranks,\nsmoothed over 20 updates)")
    ax_r.legend(loc="lower right", fontsize=8)
    ax_r.set_title(f"elastic job {job[0].run.path.parent.name}: dotted = the update a "
                   "relaunch continued from", fontsize=9)
    ax_n.set_ylabel("ranks")
    ax_n.set_ylim(0, max(a.run.meta["world_size"] for a in job) + 1)
    ax_t.set_ylabel("wall clock (s since\nthe job started)")
    ax_t.set_xlabel("update")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.elastic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", help="the elastic job's run directory (RUN_DIR/NAME)")
    parser.add_argument("-o", "--out", default="", help="also draw the figure here (PNG)")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.job)
    except FileNotFoundError as err:
        parser.exit(2, f"python -m analysis.elastic: error: {err}\n")
    table = attempts_table(job)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, na_rep="-",
                              float_format=lambda v: f"{v:.3g}" if abs(v) < 100
                              else f"{v:.0f}"))
    if args.out:
        draw(job, Path(args.out))
        print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

