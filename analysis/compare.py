"""``python -m analysis.compare RUN_A RUN_B``: how two runs' configurations and results
differ.

Prints every configuration field whose value differs (the seed included; the run's name,
directory and resume path left out), the rank counts where they differ, then the two
runs' results side by side with B/A: env steps, wall time, env steps/s, updates/s, final
mean return, the experience ranks' shares of compute, waiting and transfer, and bytes
sent per env step.  A run still going (or stopped before its summary) is read as far as
its log goes and marked ``unfinished``.

    python -m analysis.compare runs/butterfly-sync-4r-lr3e-4 runs/butterfly-sync-4r-lr1e-3
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .load import NOT_CONFIG, load_run, run_row, shown

#: the results compared, with their printed names and formats
RESULTS = (("env_steps", "env steps", ",.0f"), ("wall_s", "wall s", ".1f"),
           ("env_steps_per_s", "env steps/s", ".1f"), ("updates", "updates", ",.0f"),
           ("updates_per_s", "updates/s", ".2f"),
           ("final_mean_return", "final mean return", ".1f"),
           ("compute_share", "compute share", ".3f"), ("wait_share", "wait share", ".3f"),
           ("transfer_share", "transfer share", ".3f"),
           ("bytes_per_env_step", "bytes sent / env step", ",.0f"))


def differences(a: dict, b: dict) -> list[tuple[str, str, str]]:
    """``(field, a's, b's)`` for every configuration field that differs (seed included)."""
    skip = set(NOT_CONFIG) - {"seed"}
    keys = sorted((set(a) | set(b)) - skip)
    return [(k, shown(a.get(k, "(absent)")), shown(b.get(k, "(absent)")))
            for k in keys if a.get(k) != b.get(k)]


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def report(path_a: Path, path_b: Path) -> str:
    """The comparison as printed."""
    runs = [load_run(path_a), load_run(path_b)]
    rows = [run_row(r) for r in runs]
    lines = []
    for tag, run, row in zip("AB", runs, rows, strict=True):
        state = "" if row["finished"] else ", unfinished"
        ranks = f"{row['ranks']} rank{'s' * (row['ranks'] != 1)}"
        lines.append(f"{tag}: {run.path}  ({run.label}, {ranks}, {run.config['env']}, "
                     f"seed {run.config['seed']}{state})")
    diff = differences(runs[0].config, runs[1].config)
    if rows[0]["ranks"] != rows[1]["ranks"]:
        diff.insert(0, ("ranks", str(rows[0]["ranks"]), str(rows[1]["ranks"])))
    verb = "field differs" if len(diff) == 1 else "fields differ"
    lines += ["", f"configuration: {len(diff)} {verb}" if diff
              else "configuration: identical (apart from name and directory)"]
    width = max([len(k) for k, _, _ in diff] + [5])
    wa = max([len(a) for _, a, _ in diff] + [1])
    lines += [f"  {k:<{width}}  {a:>{wa}}  ->  {b}" for k, a, b in diff]
    lines += ["", f"  {'result':<22} {'A':>14} {'B':>14} {'B/A':>8}"]
    for key, name, fmt in RESULTS:
        a, b = rows[0][key], rows[1][key]
        ratio = b / a if all(isinstance(v, (int, float)) and math.isfinite(v)
                             for v in (a, b)) and a else None
        lines.append(f"  {name:<22} {_cell(a, fmt):>14} {_cell(b, fmt):>14} "
                     f"{_cell(ratio, '.3f'):>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path, help="a run directory (holding run.h5)")
    parser.add_argument("run_b", type=Path, help="another run directory")
    args = parser.parse_args(argv)
    for path in (args.run_a, args.run_b):
        if not (path / "run.h5").is_file():
            what = "no such directory" if not path.exists() else "not a run directory (no run.h5)"
            print(f"analysis.compare: error: {path}: {what}", file=sys.stderr)
            return 2
    print(report(args.run_a, args.run_b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
