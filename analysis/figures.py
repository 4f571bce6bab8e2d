"""The figures of a study, each a function of the tidy tables that returns a Figure.

Shared by ``python -m analysis.plot`` and the notebooks.  Colours follow the topology,
line styles the mode, so a design looks the same in every figure.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

# the project's one palette, and the simulator's own figure (re-exported for notebooks)
from mpirl.study.figures import MODE_STYLES, TOPOLOGY_COLORS  # noqa: F401
from mpirl.study.figures import color as _color
from mpirl.study.figures import predicted_scaling_figure  # noqa: F401

from mpirl.telemetry.schema import ACTOR_LEARNER_MODES, LOSSES

from .load import COMPUTE_PHASES, Run, breakdown, role_breakdown, scaling
from .spans import PART_LABELS, spans

#: MPICH's forced algorithms in mpirl.bench results (dashed lines)
MPICH_COLORS = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f", "#ff7f0e"]
PART_COLORS = {"env_s": "#4c72b0", "forward_s": "#8da0cb", "straggle_s": "#c6dbef",
               "backward_s": "#55a868", "optimizer_s": "#8c8c8c", "other_s": "#dcdcdc",
               "wait_s": "#dd8452", "transfer_s": "#c44e52", "exchange_s": "#c44e52",
               "infer_wait_s": "#e6a0c4", "send_s": "#937860", "param_wait_s": "#f0b27a",
               "batch_wait_s": "#fdd9b5", "reply_s": "#b07aa1", "data_wait_s": "#ffbe7d",
               "publish_s": "#76b7b2", "replay_s": "#edc948"}
#: the designs drawn by mode alone (actor-learner and replay designs): a colour each,
#: dash-dot lines
DESIGN_COLORS = {"impala": "#9467bd", "seed": "#e377c2", "ga3c": "#bcbd22",
                 "apex": "#17becf", "gorila": "#7f7f7f"}


def _wrap(label: str, width: int = 14) -> str:
    """A tick label broken at spaces and commas into lines of about ``width`` characters."""
    lines, line = [], ""
    for word in filter(None, label.replace(",", ",\x00").replace(" ", "\x00").split("\x00")):
        if line and len(line) + len(word) > width:
            lines.append(line.rstrip())
            line = ""
        line += word + " "
    return "\n".join([*lines, line.rstrip()])


def _style(topology: str, mode: str) -> dict:
    """Colour and line style of a design in every figure."""
    if mode in DESIGN_COLORS:
        return {"color": DESIGN_COLORS[mode], "linestyle": "-."}
    return {"color": _color(topology), "linestyle": MODE_STYLES.get(mode, "-")}


def log_ticks(axis) -> None:
    """A log axis labelled at 1, 2 and 5 of every decade (plain numbers), so that a range
    narrower than a decade still reads."""
    axis.axes.set_xscale("log") if axis is axis.axes.xaxis else axis.axes.set_yscale("log")
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    axis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=np.arange(1, 10)))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


#: env steps and seconds on a linear axis: 0, 250k, 500k, 1M rather than 1e6 offsets
STEPS = matplotlib.ticker.EngFormatter(sep="")


# -- 1. scaling --------------------------------------------------------------------------------
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def group_styles(table: pd.DataFrame) -> dict[str, dict]:
    """Colour and line style of each group's design, and a marker of its own among the
    groups of that design (``table``: rows with group, topology, mode)."""
    styles, seen = {}, {}
    for row in table.drop_duplicates("group").sort_values("group_label").itertuples():
        n = seen.setdefault((row.topology, row.mode), 0)
        seen[(row.topology, row.mode)] = n + 1
        styles[row.group] = {**_style(row.topology, row.mode), "marker": MARKERS[n % len(MARKERS)]}
    return styles


def scaling_figure(runs: pd.DataFrame) -> plt.Figure:
    """Env steps/s, updates/s and parallel efficiency vs ranks, one line per group (one
    experiment: every field but the seed alike), with each group's ideal line scaled from
    its measured base (``efficiency_base``)."""
    table = scaling(runs)
    styles = group_styles(table)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ranks_all = sorted(table["ranks"].unique())
    bases = {}
    for (group, label, base), d in table.groupby(["group", "group_label", "efficiency_base"]):
        d = d.sort_values("ranks")
        style = dict(**styles[group], label=label)
        axes[0].errorbar(d["ranks"], d["env_steps_per_s"], yerr=d["env_steps_per_s_std"],
                         capsize=3, **style)
        axes[0].plot(d["ranks"], d["ideal_env_steps_per_s"], color=style["color"],
                     linewidth=0.8, linestyle=":")
        axes[1].errorbar(d["ranks"], d["updates_per_s"], yerr=d["updates_per_s_std"],
                         capsize=3, **style)
        (line,) = axes[2].plot(d["ranks"], d["efficiency"], **style)
        bases[label] = (line, base)
        over = d[d["oversubscribed"]]
        for ax, col in ((axes[0], "env_steps_per_s"), (axes[1], "updates_per_s"),
                        (axes[2], "efficiency")):
            ax.scatter(over["ranks"], over[col], s=90, facecolors="none",
                       edgecolors="black", zorder=3)
    axes[0].plot([], [], color="black", linewidth=0.8, linestyle=":",
                 label="ideal: linear from the measured base")
    axes[2].axhline(1.0, color="black", linewidth=1, linestyle="--")
    kinds = sorted({base for _, base in bases.values()})
    base_text = kinds[0] if len(kinds) == 1 else "per line, below"
    axes[0].set(title="throughput", ylabel="env steps / s")
    axes[1].set(title="updates", ylabel="updates / s")
    axes[2].set(title=f"parallel efficiency (base: {base_text})", ylabel="measured / ideal",
                ylim=(0, None))
    if len(kinds) > 1:
        axes[2].legend([line for line, _ in bases.values()],
                       [f"{label}: {base}" for label, (_, base) in bases.items()], fontsize=7,
                       loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    for ax in axes:
        ax.set_xlabel("MPI ranks")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks_all, [str(r) for r in ranks_all])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.16), frameon=False)
    note = " (circled: more ranks than cores, timings suspect)" \
        if table["oversubscribed"].any() else ""
    fig.suptitle(f"Scaling: throughput and efficiency vs ranks{note}")
    fig.tight_layout()
    return fig


# -- 2. per-rank timeline ---------------------------------------------------------------------
def timeline_window(run: Run, updates: int = 8) -> tuple[float, float]:
    """A window of about ``updates`` updates of the slowest rank, from the middle of the run."""
    u = run.updates
    end = (u["t_run_s"] + u["busy_s"]).max()
    per_update = end / max(1, u.groupby("rank").size().max())     # wall time per update
    width = min(end, max(per_update * updates, 1e-3))
    start = max(0.0, end / 2 - width / 2)
    return start, start + width


def timeline_figure(run: Run, window: tuple[float, float] | None = None) -> plt.Figure:
    """Compute, waiting and transfer as bars along time, one row per rank."""
    u = run.updates
    lo, hi = window or timeline_window(run)
    u = u[(u["t_run_s"] + u["busy_s"] >= lo) & (u["t_run_s"] <= hi)]
    ranks = sorted(run.updates["rank"].unique())
    sequential = run.config["mode"] in ACTOR_LEARNER_MODES
    fig, ax = plt.subplots(figsize=(13, 0.55 * len(ranks) + 1.8))
    for r in u.itertuples():
        # the whole update in the 'other' colour: what no phase covers shows through
        ax.broken_barh([(r.t_run_s, r.busy_s)], (r.rank - 0.38, 0.76),
                       color=PART_COLORS["other_s"], linewidth=0)
    # the exchange as one bar where phases are drawn in turn, else its wait and transfer;
    # the rollout's env and forward passes in one colour where they interleave
    hidden = ("wait_s", "transfer_s") if sequential else ("exchange_s",)
    drawn = spans(u, run.config["mode"])
    for s in drawn[~drawn["part"].isin(hidden)].itertuples():
        colour = "env_s" if s.part == "forward_s" and not sequential else s.part
        ax.broken_barh([(s.start_s, s.dur_s)], (s.rank - 0.38, 0.76),
                       color=PART_COLORS[colour], linewidth=0)
    roles = run.updates.groupby("rank")["role"].first()
    ax.set_yticks(ranks, [f"rank {r}" + (f" ({roles[r]})" if roles[r] != "worker" else "")
                          for r in ranks])
    ax.invert_yaxis()
    ax.set_xlim(lo, hi)
    ax.set_xlabel("seconds since the run started")
    present = [p for p in PART_COLORS if p in u and u[p].fillna(0).sum() > 0] + ["other_s"]
    shown = [p for p in PART_COLORS if (p in present or p in ("wait_s", "transfer_s")
             and not sequential) and p != "exchange_s" and (sequential or p != "forward_s")]
    handles = [plt.Rectangle((0, 0), 1, 1, color=PART_COLORS[p]) for p in shown]
    labels = PART_LABELS if sequential else {**PART_LABELS, "env_s": "env + forward (rollout)"}
    ax.legend(handles, [labels[p] for p in shown], ncol=4, fontsize=8,
              loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    strag = ",".join(run.config.get("straggler") or []) or "none"
    order = "; each row's phases drawn in turn" if sequential else ""
    ax.set_title(f"Per-rank timeline: {run.title}, {len(ranks)} ranks, straggler {strag} "
                 f"({hi - lo:.2f} s window{order})")
    fig.tight_layout()
    return fig


# -- 3. breakdown ------------------------------------------------------------------------------
def breakdown_figure(updates: pd.DataFrame, runs: pd.DataFrame) -> plt.Figure:
    """Mean seconds per update, stacked by phase, per design x rank count (worker ranks)."""
    table = breakdown(updates, runs).sort_values(["ranks", "group_label"])
    parts = [p for p in (*COMPUTE_PHASES, "wait_s", "transfer_s") if table[p].sum() > 0]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.75 * len(table) + 2), 5))
    x = np.arange(len(table))
    bottom = np.zeros(len(table))
    for part in parts:
        values = table[part].to_numpy() * 1e3
        ax.bar(x, values, bottom=bottom, color=PART_COLORS[part], label=PART_LABELS[part])
        bottom += values
    labels = [_wrap(f"{r.group_label}, {r.ranks}r") for r in table.itertuples()]
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("ms per update (mean over worker ranks)")
    ax.set_title("Where an update's time goes, per group x ranks")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# -- 4. staleness and policy lag --------------------------------------------------------------
def staleness_figure(runs: list[Run]) -> plt.Figure:
    """Histogram of how old what was learned from was, one panel per run: applied
    gradients' staleness (async/quorum) or unrolls' policy lag (impala/seed/ga3c)."""
    cols = min(4, len(runs))                 # at most 4 panels a row
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    for ax, run in zip(axes.flat, runs, strict=False):   # the spare panels stay hidden
        lagged = run.config["mode"] in ACTOR_LEARNER_MODES
        s = run.policy_lag if lagged else run.staleness
        if not len(s) and not lagged:   # older runs: the server's applied rows
            server = run.updates[(run.updates["role"] == "server") &
                                 (run.updates["dropped"] == 0)]
            s = server["staleness"].to_numpy()
        bins = np.arange(-0.5, max(int(s.max()) if len(s) else 0, 1) + 1.5)
        ax.hist(s, bins=bins, color=_style(run.config["topology"], run.config["mode"])["color"],
                alpha=0.8)
        strag = ",".join(run.config.get("straggler") or []) or "none"
        p95 = np.percentile(s, 95) if len(s) else float("nan")
        ax.set_title(f"{run.title}, {run.meta['world_size']} ranks, straggler {strag}"
                     f"\nmean {np.mean(s) if len(s) else float('nan'):.2f}, p95 {p95:.0f}, "
                     f"n={len(s)}", fontsize=9)
        ax.set_xlabel("policy lag (learner updates since the unroll's version)" if lagged
                      else "staleness (server updates between pull and apply)")
        ax.set_ylabel(("transitions learned from" if run.config["mode"] == "apex"
                       else "unrolls learned from") if lagged else "gradients applied")
    fig.suptitle("How old was what the learner used: staleness and policy lag")
    fig.tight_layout()
    return fig


# -- 4b. time by role ---------------------------------------------------------------------------
def roles_figure(updates: pd.DataFrame, runs: pd.DataFrame) -> plt.Figure:
    """Share of each role's time in each phase, one bar per run and role: actors
    (env, forward or waiting for actions, sending, waiting for parameters), inference
    (batching wait, forward, replying), learners (waiting for data, training,
    exchange, publishing), and the gradient designs' workers and servers."""
    table = role_breakdown(updates, runs).sort_values(["ranks", "group_label", "seed", "role"])
    parts = [p for p in PART_COLORS if p in table and table[p].sum() > 0]
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.32 * len(table) + 1.5)))
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for part in parts:
        values = table[part].fillna(0.0).to_numpy()
        ax.barh(y, values, left=left, color=PART_COLORS[part], label=PART_LABELS[part])
        left += values
    ax.set_yticks(y, [f"{r.group_label} {r.ranks}r s{r.seed}: {r.role}"
                      for r in table.itertuples()], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the role's logged time (summed over its ranks)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title("Where each role's time goes")
    fig.tight_layout()
    return fig


# -- 4c. bytes per env step ---------------------------------------------------------------------
def bytes_figure(runs: pd.DataFrame) -> plt.Figure:
    """Bytes every rank sent per env step, vs ranks, one line per group: what travels
    (gradients, parameters, unrolls, observations and actions) and what it costs."""
    fig, ax = plt.subplots(figsize=(7, 4.6))
    done = runs[runs["finished"]]
    styles = group_styles(done)
    for (group, label), d in done.groupby(["group", "group_label"]):
        d = d.groupby("ranks", as_index=False)["bytes_per_env_step"].mean()
        ax.plot(d["ranks"], d["bytes_per_env_step"], label=label, **styles[group])
    ax.set(xlabel="MPI ranks", ylabel="bytes sent per env step (all ranks)",
           title="What travels, per env step")
    values = done["bytes_per_env_step"][done["bytes_per_env_step"] > 0]
    if len(values) and values.max() > 10 * values.min():    # a log axis where it spans
        log_ticks(ax.yaxis)
    else:
        ax.yaxis.set_major_formatter(STEPS)
    ax.set_xscale("log", base=2)
    ranks = sorted(done["ranks"].unique())
    ax.set_xticks(ranks, [str(r) for r in ranks])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- 5. learning curves ------------------------------------------------------------------------
def learning_figure(runs: list[Run], smooth: int = 50) -> plt.Figure:
    """Return vs env steps and vs wall-clock, one line per run, one row of panels per env
    (returns of different tasks never share an axis)."""
    envs = sorted({run.config["env"] for run in runs})
    fig, axes = plt.subplots(len(envs), 2, figsize=(14, 4.8 * len(envs)), squeeze=False)
    palette = plt.get_cmap("tab10").colors
    for i, run in enumerate(sorted(runs, key=lambda r: (r.title, r.name))):
        e = run.episodes
        if not len(e):
            continue
        row = axes[envs.index(run.config["env"])]
        ret = e["return"].rolling(min(smooth, len(e)), min_periods=1).mean()
        strag = ",".join(run.config.get("straggler") or [])
        label = f"{run.title} {run.meta['world_size']}r s{run.config['seed']}" + \
            (f" straggler {strag}" if strag and "straggler=" not in run.title else "")
        style = dict(color=palette[i % len(palette)], linewidth=1.3, label=label,
                     linestyle=_style(run.config["topology"], run.config["mode"])["linestyle"])
        row[0].plot(e["env_steps"], ret, **style)
        row[1].plot(e["t_run_s"], ret, **style)
    for env, row in zip(envs, axes, strict=True):
        row[0].set(xlabel="env steps (all ranks)", title=f"{env}: vs experience",
                   ylabel=f"episode return (mean of {smooth})")
        row[0].xaxis.set_major_formatter(STEPS)
        row[1].set(xlabel="wall-clock seconds", title=f"{env}: vs time")
        row[1].sharey(row[0])
        for ax in row:
            ax.grid(alpha=0.3)
        if row[1].get_lines():
            row[1].legend(fontsize=7, ncol=2)
        else:                   # no run of this env finished an episode: say so, no axes
            for ax in row:
                ax.set(xticks=[], yticks=[])
                ax.text(0.5, 0.5, "no episode finished", ha="center", va="center",
                        transform=ax.transAxes, color="0.4")
    fig.suptitle("Learning curves")
    fig.tight_layout()
    return fig


# -- 5b. losses -------------------------------------------------------------------------------
#: the roles that compute gradients: sync/async workers, impala/seed/ga3c learners
LOSS_ROLES = ("worker", "learner")
LOSS_LABELS = {"policy_loss": "policy loss", "value_loss": "value loss", "entropy": "entropy",
               "approx_kl": "approx. KL (clipped objective)"}


def has_losses(run: Run) -> bool:
    """The run's log holds losses (schema 4 and later; worker or learner rows)."""
    rows = run.updates[run.updates["role"].isin(LOSS_ROLES)]
    return bool(len(rows)) and rows["policy_loss"].notna().any()


def losses_figure(runs: list[Run], smooth: int = 20) -> plt.Figure:
    """Policy loss, value loss, entropy and approximate KL of every gradient computed,
    against the env steps all ranks had collected by then, one line per run (a rolling
    mean over ``smooth`` rows of all worker ranks, in time order), one row of panels per
    env (losses of different tasks never share an axis)."""
    envs = sorted({run.config["env"] for run in runs})
    fig, grid = plt.subplots(len(envs), len(LOSSES), figsize=(4.6 * len(LOSSES),
                                                              3.9 * len(envs) + 0.8),
                             squeeze=False)
    palette = plt.get_cmap("tab10").colors
    for i, run in enumerate(sorted(runs, key=lambda r: (r.title, r.name))):
        axes = grid[envs.index(run.config["env"])]
        u = run.updates[run.updates["role"].isin(LOSS_ROLES)].sort_values("t_unix_s")
        steps = run.updates[run.updates["role"].isin(("worker", "actor"))].sort_values(
            "t_unix_s").set_index("t_unix_s")["env_steps"].cumsum()
        steps = np.interp(u["t_unix_s"], steps.index, steps.to_numpy()) if len(steps) \
            else u["env_steps"].cumsum()
        style = dict(color=palette[i % len(palette)], linewidth=1.2,
                     linestyle=MODE_STYLES.get(run.config["mode"], "-"),
                     label=f"{run.title} {run.meta['world_size']}r s{run.config['seed']}")
        for ax, column in zip(axes, LOSSES, strict=True):
            if u[column].notna().any():
                ax.plot(steps, u[column].rolling(min(smooth, len(u)), min_periods=1).mean(),
                        **style)
    for env, axes in zip(envs, grid, strict=True):
        for ax, column in zip(axes, LOSSES, strict=True):
            ax.set(title=f"{env}: {LOSS_LABELS[column]}", xlabel="env steps (all ranks)")
            ax.xaxis.set_major_formatter(STEPS)
            ax.grid(alpha=0.3)
            if not ax.lines:
                ax.text(0.5, 0.5, "no run with --clip-ratio > 0" if column == "approx_kl"
                        else "no data", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
        handles, labels = axes[0].get_legend_handles_labels()
        axes[0].legend(handles, labels, fontsize=7, loc="upper left",
                       bbox_to_anchor=(0.0, -0.2), frameon=False)
    fig.suptitle(f"Losses per gradient (rolling mean of {smooth}; each rank's own gradient, "
                 "before averaging)")
    fig.tight_layout()
    return fig


# -- 6. collective latency ---------------------------------------------------------------------
def latency_figure(bench: pd.DataFrame) -> plt.Figure:
    """Latency and bandwidth vs message size per topology, one row per (op, ranks)."""
    groups = list(bench.groupby(["op", "ranks"]))
    fig, axes = plt.subplots(len(groups), 2, figsize=(13, 4.2 * len(groups)), squeeze=False)
    forced = sorted({t for t in bench["topology"] if ":" in t})
    mpich_colors = dict(zip(forced, MPICH_COLORS * (1 + len(forced) // len(MPICH_COLORS)),
                            strict=False))
    for (ax_lat, ax_bw), ((op, ranks), d) in zip(axes, groups, strict=True):
        for topo, t in d.groupby("topology"):
            t = t.sort_values("bytes")
            kw = dict(color=mpich_colors.get(topo) or _color(topo), marker="o", markersize=3,
                      label=topo if ":" not in topo else f"MPICH {topo.split(':')[1]}",
                      linestyle="--" if ":" in topo else "-")
            ax_lat.plot(t["bytes"], t["avg_s"] * 1e6, **kw)
            ax_lat.fill_between(t["bytes"], t["min_s"] * 1e6, t["max_s"] * 1e6,
                                color=kw["color"], alpha=0.12)
            ax_bw.plot(t["bytes"], t["bytes"] / t["avg_s"] / 2 ** 20, **kw)
        ax_lat.set(xscale="log", yscale="log", xlabel="message size (bytes)",
                   ylabel="latency (us; band: min-max over ranks)",
                   title=f"{op} latency, {ranks} ranks")
        ax_bw.set(xscale="log", xlabel="message size (bytes)", ylabel="MiB / s (size / latency)",
                  title=f"{op} bandwidth, {ranks} ranks")
        for ax in (ax_lat, ax_bw):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3, which="both")
        ax_lat.legend(fontsize=8)
    fig.suptitle("Collective latency vs message size (mpirl.bench; dashed: MPICH forced to "
                 "one algorithm)")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    return fig


# -- 7. simulator step times -------------------------------------------------------------------
def sim_steps_figure(runs: list[Run]) -> plt.Figure:
    """Distribution of per-step simulator time (``sim_steps``), one panel per run:
    the heavy tail that makes slow simulators stragglers."""
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 3.8), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        t = run.sim_steps["sim_s"].to_numpy() * 1e3
        bins = np.logspace(np.log10(max(t.min(), 1e-3)), np.log10(t.max()), 50)
        ax.hist(t, bins=bins, color=_color(run.config["topology"]), alpha=0.8)
        log_ticks(ax.xaxis)
        median, p99 = np.quantile(t, [0.5, 0.99])
        for value, style in ((median, "-"), (p99, "--")):
            ax.axvline(value, color="black", linestyle=style, linewidth=1)
        repeat = run.config.get("action_repeat", 1)
        ax.set_title(f"{run.config['env']}, {run.meta['world_size']} ranks\n"
                     f"median {median:.1f} ms, p99 {p99:.1f} ms (n={len(t)})", fontsize=9)
        ax.set_xlabel("ms per env step" + (f" ({repeat} simulator steps)" if repeat > 1 else ""))
        ax.set_ylabel("steps")
    fig.suptitle("Simulator time per step (solid: median, dashed: p99)")
    fig.tight_layout()
    return fig
