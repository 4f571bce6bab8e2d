"""Parameter delivery in situ: impala (or apex) trained with the per-actor push against
``--param-delivery broadcast`` through ring, on 8 ranks of the emulated cluster (8 nodes,
or ``--layout`` nodes of several ranks) at 100 Mbit/s and 1 Gbit/s.

    python experiments/bench_delivery_training.py               # ~13 min on 2 cores, as root
    python experiments/bench_delivery_training.py --mode apex   # ~15 min
    python experiments/bench_delivery_training.py --layout 4x2:cyclic   # ~20 min
    python experiments/bench_delivery_training.py --mode apex --layout 4x2:cyclic   # ~25 min

``experiments/bench_delivery.py`` times one delivery alone; this script asks what the
choice does to a training run.  On its own emulated cluster (``mpirldtrn``, 8 nodes x 1
rank by default, taken down at the end, also on error) ``python -m mpirl.run --mode impala`` trains
a network of about 1.1 M float32 parameters (``--hidden 512 512 512``: 4.2 MiB per copy)
on ``Delay-v0``, a simulator whose every step costs ``--cost-ms`` (sleep: a slow
simulator such as OpenSim, without its CPU), 2 envs x 64 steps per unroll, parameters
refreshed after every update (``--param-refresh unroll``, the default):

* ``push``: each unroll's reply carries a whole copy to its actor (7 copies per round
  out of the learner's link);
* ``ring``: ``--param-delivery broadcast --topology ring``: one pipelined chain per
  update, the learner sending one copy.

``--mode apex`` trains SAC (Delay-v0's actions are a Box) with the learner, one replay
rank and 6 actors; ``push``: each actor asks every ``--actor-refresh-steps`` (400, so
every 4th rollout of 128 steps) and the reply carries a copy; ``ring``: the learner
starts a broadcast after every update unless one is still in flight
(``--refresh-every 1``), and each actor takes the newest at its refresh points.  Its
tables go to ``training-apex.md`` and ``training-apex.json``, with a third way, ``ring-every-4``:
the broadcast every 4th update (``--refresh-every 4``), about the push's cadence.

``--layout NODESxPER[:cyclic]`` (default ``8x1``) runs the same 8 ranks on NODES nodes of
PER ranks, numbered in blocks or round robin (``:cyclic``, as under a scheduler's cyclic
distribution; ``python -m mpirl.cluster exec --placement cyclic``), and adds a way:

* ``hierarchical:ring``: ``--param-delivery broadcast --topology hierarchical --inner
  ring``: the learner's node leader chains the copy to the other nodes' leaders, each
  leader hands it to its node's ranks through shared memory (nodes found by shared
  memory, whatever the numbering).

Its tables go to ``training[-apex]-NxP[-cyclic].md`` and ``.json``.

apex's push replies move as ``--reply-progress auto`` (the default) has them: on the
learner's progress thread where a replay rank shares its node (4 x 2 and 2 x 4 in blocks),
inside its own MPI calls where its batches come over the network (8 x 1, round robin).
``--push-calls`` adds the ways ``push-thread`` (``--reply-progress thread``) and
``push-calls`` (``--reply-progress calls``: only inside
the learner's own MPI calls, as every apex table measured before the thread; at
``--layout 4x2`` in blocks it does not end).  Each run records which it had (summary.json's
``reply_progress``), and a table says so.  ``--ways push-thread,push-calls`` runs only the
ways named (the first is the ratios' base); with ``--out`` elsewhere it leaves the
committed tables alone (the tables under ``reply-progress/`` were measured when the
thread was the default: their ``push`` is ``push-thread``):

    python experiments/bench_delivery_training.py --mode apex --layout 2x4 --push-calls \
        --ways push-thread,push-calls --out docs/figures/delivery/reply-progress   # ~18 min

The ways alternate (ABAB: the same conditions for both), ``--trials`` of each per link
rate.  Per run, from summary.json and rank 0's log: env steps/s over the run's training
wall time, learner updates/s, the actors' env share (the rest is waiting on their sends
and on parameters), mean policy lag, and the learner's link MiB per update.  Writes
``training.md`` and ``training.json`` (``--mode apex``: ``training-apex.*``) under
``--out`` (medians over trials; beside ``bench_delivery.py``'s ``results.md``).  The JSON
records its ``mode`` and ``layout`` beside the runs by link rate; ``--rewrite`` refuses a
JSON of another mode or layout than the flags name (one written before it records neither
and is taken as the flags say).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "mpirldtrn"
SUBNET = "10.231.93.0/24"
RANKS = 8
RATES = ["100mbit", "1gbit"]
RING = ["--param-delivery", "broadcast", "--topology", "ring"]
WAYS = {"push": [], "ring": RING}
#: apex adds the broadcast at about the push's cadence: every 4th update
APEX_WAYS = {**WAYS, "ring-every-4": [*RING, "--refresh-every", "4"]}
#: on nodes of several ranks: the two-level broadcast, a ring among the node leaders
TWO_LEVEL = {"hierarchical:ring": ["--param-delivery", "broadcast", "--topology",
                                   "hierarchical", "--inner", "ring"]}
#: apex's push with its replies moving only inside the learner's MPI calls
PUSH_CALLS = {"push-thread": ["--reply-progress", "thread"],
              "push-calls": ["--reply-progress", "calls"]}
#: per mode: the flags that pick it, its actors, the output files' suffix, its ways
MODES = {"impala": (["--mode", "impala"], RANKS - 1, "", WAYS),
         "apex": (["--mode", "apex", "--replay-ranks", "1"], RANKS - 2, "-apex", APEX_WAYS)}


def layout(text: str) -> tuple[int, int, str]:
    """``--layout`` as (nodes, ranks per node, order); a bad one stops the script (one
    line, exit 2)."""
    from mpirl.cluster.launch import layout_or_exit

    return layout_or_exit(text, RANKS, "bench_delivery_training")


def layout_text(nodes: int, per: int, order: str) -> str:
    """A layout as ``--layout`` spells it: NODESxPER, ``:cyclic`` for round robin."""
    return f"{nodes}x{per}" + (":cyclic" if order == "cyclic" else "")


def stem(mode: str, text: str) -> str:
    """A table's file name without its extension: training[-apex][-NxP[-cyclic]]."""
    return "training" + MODES[mode][2] + ("" if text == "8x1" else "-" + text.replace(":", "-"))


def run_args(mode: str, cost_ms: float, unrolls: int, run_dir: Path,
             name: str) -> list[str]:
    from mpirl.cluster.trials import SLOW_SIM_ROLLOUT, slow_sim_argv

    flags, actors = MODES[mode][:2]
    return slow_sim_argv(unrolls * actors * SLOW_SIM_ROLLOUT, run_dir, name, cost_ms,
                         *flags)


def measure(run: Path, actors: int) -> dict:
    from mpirl.telemetry.read import load_run

    s = json.loads((run / "summary.json").read_text())
    if s["broadcasts_received"] != s["broadcasts_sent"] * actors:
        raise SystemExit(f"bench_delivery_training: {run.name}: {s['broadcasts_sent']} "
                         f"broadcasts sent, {s['broadcasts_received']} joined")
    read = load_run(run)
    u = read.updates
    learner = u[u["rank"] == 0]
    return {"reply_progress": s["reply_progress"],      # auto: as the learner's node chose
            "steps_per_s": s["env_steps"] / s["wall_s"],
            "updates_per_s": s["updates"] / s["wall_s"],
            "actor_env_share": s["actor_env_share"], "policy_lag": s["mean_policy_lag"],
            "learner_mib_per_update": float(learner["bytes_sent"].sum()) / s["updates"] / 2**20,
            "params": s["gradient_bytes"] // 4}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), default="impala")
    parser.add_argument("--out", default="docs/figures/delivery")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--unrolls", type=int, default=30, help="unrolls per actor")
    parser.add_argument("--cost-ms", type=float, default=3.0)
    parser.add_argument("--layout", default="8x1",
                        help="NODESxPER[:cyclic] for the 8 ranks (default 8x1; several ranks "
                             "per node add the hierarchical:ring way)")
    parser.add_argument("--push-calls", action="store_true",
                        help="apex: add the ways push-thread and push-calls "
                             "(--reply-progress thread, calls)")
    parser.add_argument("--ways", default="",
                        help="comma-separated: only these ways (default: every way of the "
                             "mode and layout)")
    parser.add_argument("--rewrite", action="store_true",
                        help="rewrite the mode's and layout's table (.md) from its .json "
                             "under --out, running nothing")
    args = parser.parse_args()
    nodes, per, order = layout(args.layout)
    out = (ROOT / args.out).resolve()
    _, actors, _, ways = MODES[args.mode]
    ways = {**ways, **(TWO_LEVEL if per > 1 else {}),
            **(PUSH_CALLS if args.push_calls and args.mode == "apex" else {})}
    if args.ways:
        chosen = args.ways.split(",")
        unknown = [w for w in chosen if w not in ways]
        if unknown:
            parser.exit(2, f"bench_delivery_training: --ways {args.ways}: no way "
                           f"{', '.join(map(repr, unknown))} here; allowed: "
                           f"{', '.join(ways)}\n")
        if not args.rewrite and out == (ROOT / "docs/figures/delivery").resolve():
            parser.exit(2, f"bench_delivery_training: --ways {args.ways} would overwrite "
                           "the committed table of every way; give --out another folder\n")
        ways = {w: ways[w] for w in chosen}
    table = out / f"{stem(args.mode, args.layout)}.json"
    if args.rewrite:
        results = json.loads(table.read_text())
        recorded = (results.get("mode"), results.get("layout"))
        if recorded != (None, None) and recorded != (args.mode, layout_text(nodes, per, order)):
            parser.exit(2, f"bench_delivery_training: {table.name} holds mode "
                           f"{recorded[0]}, layout {recorded[1]}: give --mode {recorded[0]} "
                           f"--layout {recorded[1]}\n")
        write(out, results, args)
        return 0
    from mpirl.cluster.trials import alternate

    runs = out / "training-runs"
    out.mkdir(parents=True, exist_ok=True)
    results = {"mode": args.mode, "layout": layout_text(nodes, per, order)}
    results |= alternate((NAME, nodes, SUBNET), RATES, ways, args.trials, runs,
                         lambda runs, name: run_args(args.mode, args.cost_ms, args.unrolls,
                                                     runs, name),
                         lambda run: measure(run, actors), per_node=per, order=order)
    table.write_text(json.dumps(results, indent=1))
    write(out, results, args)
    shutil.rmtree(runs, ignore_errors=True)       # the table's numbers are in training.json
    return 0


def write(out: Path, table: dict, args) -> None:
    import numpy as np

    results = {rate: table[rate] for rate in RATES if rate in table}

    base = next(iter(results[RATES[0]]))          # push, unless --ways chose otherwise
    first = results[RATES[0]][base][0]
    trials = len(results[RATES[0]][base])
    actors = MODES[args.mode][1]
    nodes, per, order = layout(args.layout)
    two_level = ("; `hierarchical:ring`: `--param-delivery broadcast --topology hierarchical "
                 "--inner ring`, the copy chained among the node leaders and handed on "
                 "inside each node through shared memory") if per > 1 else ""
    if args.mode == "impala":
        setup = (f"the learner and {actors} actors. impala", "2 envs x 64 steps per unroll, "
                 "parameters refreshed after every update; `push`: every unroll's reply "
                 "carries a copy; `ring`: `--param-delivery broadcast --topology ring`"
                 + two_level)
    else:
        said = {"push": "`push`: each actor asks every 400 env steps (every 4th rollout) "
                        "and the reply carries a copy",
                "ring": "`ring`: `--param-delivery broadcast --topology ring`, a broadcast "
                        "started after every update unless one is in flight, each actor "
                        "taking the newest at its refresh points",
                "ring-every-4": "`ring-every-4`: the same, a broadcast every 4th update "
                                "(`--refresh-every 4`)",
                "hierarchical:ring": two_level[2:],
                "push-thread": "`push-thread`: each actor asks every 400 env steps and "
                               "the reply carries a copy, moved on the learner's progress "
                               "thread (`--reply-progress thread`)",
                "push-calls": "`push-calls`: the same push with `--reply-progress calls`"}
        ways = [said[w] for w in results[RATES[0]] if said.get(w)]
        setup = (f"the learner, one replay rank and {actors} actors. apex (SAC)",
                 "; ".join(["2 envs x 64 steps per rollout", *ways,
                            "policy lag: the updates between the parameters that acted "
                            "and the learner's, over the transitions trained on"]))
    measured = list(results[RATES[0]])
    title = ("push against broadcast" if any(not w.startswith("push") for w in measured)
             else " against ".join(measured))
    lines = [f"# Parameter delivery in a training run: {args.mode}, {title} "
             "(experiments/bench_delivery_training.py)", "",
             f"Emulated cluster, {nodes} nodes x {per} rank{'s' * (per > 1)}"
             + {"block": "" if per == 1 else " (in blocks: ranks 0-"
                f"{per - 1} on the learner's node)",
                "cyclic": f" (round robin: rank r on node r mod {nodes}, the learner with "
                f"actor{'s' * (per > 2)} {', '.join(map(str, range(nodes, RANKS, nodes)))} "
                "on its node)"}[order]
             + f": {setup[0]} with "
             f"{first['params']:,} float32 parameters "
             f"({first['params'] * 4 / 2**20:.2f} MiB per copy) on Delay-v0 at "
             f"{args.cost_ms:g} ms a step, {setup[1]}. The ways alternate, "
             f"{trials} run{'s' * (trials != 1)} of each per link; medians over runs. "
             f"Ratio: each way's steps/s over {base}'s.", "",
             "| link | way | env steps/s | learner updates/s | actors' env share | "
             f"policy lag | {'learner link MiB' if per == 1 else 'learner MiB sent'} / update "
             f"| steps/s over {base}'s |",
             "|---|---|---|---|---|---|---|---|"]
    for rate, by_way in results.items():
        med = {way: {k: float(np.median([t[k] for t in runs])) for k in runs[0]
                      if k != "reply_progress"}
               for way, runs in by_way.items()}
        for way in by_way:          # as measured (an older table has fewer ways)
            m = med[way]
            lines.append(f"| {rate} | {way} | {m['steps_per_s']:.0f} | "
                         f"{m['updates_per_s']:.2f} | {m['actor_env_share']:.0%} | "
                         f"{m['policy_lag']:.2f} | {m['learner_mib_per_update']:.1f} | "
                         f"{m['steps_per_s'] / med[base]['steps_per_s']:.2f} |")
    lines += ["", "Env steps/s, run by run: " + "; ".join(
        f"{rate} {way} " + " / ".join(f"{t['steps_per_s']:.0f}" for t in runs)
        for rate, by_way in results.items() for way, runs in by_way.items()) + "."]
    if args.mode == "apex" and "push" in results[RATES[0]]:
        progress = results[RATES[0]]["push"][0].get("reply_progress")   # None: before it
        lines += ["", "The push's replies moved " + {
            "thread": "on the learner's progress thread (`--reply-progress thread`, or "
                      "`auto`, the default, with a replay rank on the learner's node)",
            "calls": "only inside the learner's own MPI calls (`--reply-progress calls`, or "
                     "`auto`, the default, with the learner's batches coming over the "
                     "network)"}.get(progress, "only inside the learner's own MPI calls "
                                               "(measured before the learner's progress "
                                               "thread: `--reply-progress calls` now)") + "."]
    if per > 1:
        lines += ["", "Learner MiB sent: every byte rank 0 sent, to ranks on its own node "
                  "(shared memory) as well as over its link."]
    (out / f"{stem(args.mode, args.layout)}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
