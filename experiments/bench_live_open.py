"""Opening a live rank log: how often a plain ``h5py.File(path, "r")`` fails while a writer
flushes into the file back to back, with the machine's cores busy.

    python experiments/bench_live_open.py [--opens 100000] [--load 2] [--rounds 1]

A writer process appends one update row (with an episode and simulator times) and
flushes every 7 rows, without pausing (the worst case: flushes back to back); this
process opens and closes the file with plain h5py as fast as it can until it has made
``--opens`` opens, counting the opens that raise, and then reads the same file the
same number of times through ``mpirl.telemetry.read.read_h5`` (which reads again while
the file is changing).  ``--load N`` keeps N more processes spinning on the CPU (a
loaded CI machine: N = its core count).  Prints one line per round and reader, and the
first error messages seen.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpirl.telemetry.h5log import RankLog  # noqa: E402
from mpirl.telemetry.read import read_h5  # noqa: E402


def write(run_dir: Path, stop, started) -> None:
    log = RankLog(run_dir, 0, "worker", 7)
    started.set()
    update = 0
    while not stop.is_set():
        update += 1
        log.add_update({"update": update, "t_s": log.now()})
        log.episode(update, 1.0, 10)
        log.sim_times(update, np.full((8, 2), 1e-3))
    log.close()


def spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def plain(path: Path) -> None:
    h5py.File(path, "r").close()


def retried(path: Path) -> None:
    read_h5(path, lambda f: len(f["updates"]))


def measure(opens: int, load: int) -> list[tuple[str, int, int, float, list[str]]]:
    ctx = mp.get_context("spawn")
    stop, started = ctx.Event(), ctx.Event()
    out = []
    with tempfile.TemporaryDirectory(prefix="mpirl-live-") as tmp:
        spinners = [ctx.Process(target=spin, args=(stop,)) for _ in range(load)]
        writer = ctx.Process(target=write, args=(Path(tmp), stop, started))
        for p in (*spinners, writer):
            p.start()
        try:
            if not started.wait(60):
                raise SystemExit("the writer never started")
            time.sleep(0.5)
            path = Path(tmp) / "rank0000.h5"
            for name, reader in (("plain h5py.File", plain), ("read_h5", retried)):
                failed, errors, t0 = 0, [], time.perf_counter()
                for _ in range(opens):
                    try:
                        reader(path)
                    except OSError as err:
                        failed += 1
                        if len(errors) < 3:
                            errors.append(str(err).splitlines()[0][:160])
                out.append((name, opens, failed, time.perf_counter() - t0, errors))
        finally:
            stop.set()
            for p in (writer, *spinners):
                p.join(60)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=100_000)
    parser.add_argument("--load", type=int, default=2, help="spinning processes beside")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if args.opens < 1 or args.load < 0 or args.rounds < 1:
        parser.error("--opens and --rounds: at least 1; --load: at least 0")
    for round_ in range(args.rounds):
        for name, n, failed, seconds, errors in measure(args.opens, args.load):
            print(f"round {round_ + 1}  {name:16s} {n:7d} opens  {failed:4d} failed  "
                  f"({seconds:.0f} s, load {args.load})", flush=True)
            for err in errors:
                print(f"    {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
