"""Behaviour kept across a redesign: the final parameter SHA-256 of every design, before
and after.

    python experiments/check_digests.py record DIR     # on the code before the change
    python experiments/check_digests.py check DIR      # on the code after it

``record`` runs every case below once into ``DIR/<case>/`` and writes
``DIR/digests.json`` (case -> SHA-256).  ``check`` runs each case again: a synchronous
case plainly (it is deterministic), an asynchronous one with ``--replay-schedule
DIR/<case>`` (its recorded order of events enforced, :mod:`mpirl.resilience.schedule`),
and compares the digests; it prints one line per case and exits 1 if any differs.
Budgets are small (a few thousand env steps on CartPole): the point is equal bytes, not
learning.  Every job has a time cap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpirl.launch import mpi_env, mpiexec_command  # noqa: E402

BASE = ["--env", "CartPole-v1", "--seed", "7", "--log-every", "1000"]
#: case -> (ranks, flags, asynchronous: replayed from its schedule when checked)
CASES: dict[str, tuple[int, list[str], bool]] = {
    **{f"sync-{top}-{n}r": (n, ["--mode", "sync", "--topology", top, "--total-steps", "3000"],
                            False)
       for top in ("native", "star", "tree", "butterfly", "ring", "rabenseifner")
       for n in (1, 2, 3, 4)},
    # exchanges that run another inside them: hierarchical's leaders, auto's pick, a cast
    "sync-hierarchical-4r": (4, ["--mode", "sync", "--topology", "hierarchical", "--inner",
                                 "butterfly", "--node-size", "2", "--total-steps", "3000"],
                             False),
    "sync-auto-3r": (3, ["--mode", "sync", "--topology", "auto", "--total-steps", "3000"],
                     False),
    "sync-fp16-ring-3r": (3, ["--mode", "sync", "--topology", "ring", "--compress", "fp16",
                              "--total-steps", "3000"], False),
    "async-3r": (3, ["--mode", "async", "--topology", "star", "--total-steps", "3000"], True),
    "quorum-4r": (4, ["--mode", "quorum", "--topology", "star", "--total-steps", "3000"], True),
    "async-sharded-4r": (4, ["--mode", "async", "--topology", "star", "--servers", "2",
                             "--checkpoint-every", "0", "--total-steps", "3000"], True),
    "impala-3r": (3, ["--mode", "impala", "--total-steps", "4000"], True),
    "seed-3r": (3, ["--mode", "seed", "--total-steps", "3000"], True),
    "ga3c-4r": (4, ["--mode", "ga3c", "--total-steps", "3000"], True),
    "apex-5r": (5, ["--mode", "apex", "--replay-ranks", "2", "--learning-starts", "500",
                    "--replay-batch", "64", "--total-steps", "4000"], True),
    "gorila-local-4r": (4, ["--mode", "gorila", "--servers", "2", "--learning-starts", "500",
                            "--replay-batch", "64", "--total-steps", "4000"], True),
    "gorila-service-5r": (5, ["--mode", "gorila", "--servers", "2", "--gorila-replay",
                              "service", "--learning-starts", "500", "--replay-batch", "64",
                              "--total-steps", "4000"], True),
    # the replay designs' learners on Box actions (SAC) and sync-replay with both
    **{f"{mode}-{env[:4].lower()}-{n}r": (n, ["--mode", mode, "--env", env, *flags,
                                              "--learning-starts", "300", "--replay-batch",
                                              "64", "--total-steps", "1500"], mode != "sync-replay")
       for mode, env, n, flags in (
           # --update-repeat 1: sync-replay's default before it took 8 of its own
           ("sync-replay", "CartPole-v1", 3, ["--topology", "ring", "--update-repeat", "1"]),
           ("sync-replay", "Pendulum-v1", 3, ["--max-grad-norm", "0", "--update-repeat", "1"]),
           ("apex", "Pendulum-v1", 4, ["--max-grad-norm", "0"]),
           ("gorila", "Pendulum-v1", 3, ["--max-grad-norm", "0"]))},
    # the stop rule with a target reached early (the deciding rank's book)
    **{f"{mode}-target-{n}r": (n, ["--mode", mode, *flags, "--target-return", "22",
                                   "--log-every", "5", "--total-steps", "60000"], True)
       for mode, n, flags in (("async", 3, ["--topology", "star"]), ("impala", 3, []),
                              ("seed", 3, []), ("ga3c", 4, []),
                              ("gorila", 4, ["--servers", "2", "--learning-starts", "500",
                                             "--replay-batch", "64"]),
                              ("apex", 4, ["--learning-starts", "500", "--replay-batch", "64"]))},
}


def run_case(name: str, run_dir: Path, replay_from: Path | None, timeout_s: float) -> str:
    """Run one case into ``run_dir/name`` and return its parameter SHA-256."""
    ranks, flags, _ = CASES[name]
    argv = [*BASE, *flags, "--run-dir", str(run_dir), "--run-name", name]
    if replay_from is not None:
        argv += ["--replay-schedule", str(replay_from)]
    cmd = mpiexec_command(ranks, [sys.executable, "-m", "mpirl.run", *argv])
    done = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads((run_dir / name / "summary.json").read_text())["param_digest"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("dir", type=Path, help="where the recorded runs and digests.json are")
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the cases")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="cap per job")
    parser.add_argument("--keep", type=Path, default=None,
                        help="check: write the runs here (to compare their logs), not to a "
                             "temporary directory")
    args = parser.parse_args(argv)
    names = args.only or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    store = args.dir / "digests.json"
    if args.action == "record":
        args.dir.mkdir(parents=True, exist_ok=True)
        digests = json.loads(store.read_text()) if store.is_file() else {}
        for name in names:
            shutil.rmtree(args.dir / name, ignore_errors=True)   # recorded anew
            digests[name] = run_case(name, args.dir, None, args.timeout_s)
            print(f"{name:22s} {digests[name]}", flush=True)
            store.write_text(json.dumps(digests, indent=1))
        return 0
    recorded = json.loads(store.read_text())
    new = [name for name in names if name not in recorded]
    if new:      # cases added since the recording (a new topology): nothing to compare
        print(f"not recorded, skipped: {', '.join(new)}", flush=True)
        names = [name for name in names if name in recorded]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mpirl-digests-") as tmp:
        into = args.keep or Path(tmp)
        for name in names:
            replay = args.dir / name if CASES[name][2] else None
            digest = run_case(name, into, replay, args.timeout_s)
            same = digest == recorded[name]
            failed += not same
            print(f"{name:22s} {'same' if same else 'DIFFERS'} {digest[:16]} "
                  f"(recorded {recorded[name][:16]})", flush=True)
    print(f"{len(names) - failed} of {len(names)} cases kept their parameter SHA-256")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
