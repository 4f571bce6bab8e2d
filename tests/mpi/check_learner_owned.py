"""Checks that --obs-norm's statistics are the learner's (impala, seed, ga3c) or the
parameter server's (async, quorum) and travel with its parameters; run under mpiexec.

Usage: mpiexec -n N python tests/mpi/check_learner_owned.py RUN_DIR     (N >= 3)

Each case is a short run of ``mpirl.run`` in this process, with the learner's update and
the actors' (or the predictor's) parameter takes watched:

- the learners' updates merge exactly the observations they trained on (the statistics'
  count = unrolls used by every learner x rollout steps x envs); the server's, those of
  every push it took (count = the env steps the pushes reported);
- every copy an actor or the predictor acts with equals, byte for byte (parameters and
  statistics together), the learner's at the version it was published; every copy a
  worker pulls, one the server sent;
- the statistics moved: some copy taken after an update normalizes with mean != 0.

Rank 0 prints ``OK CASE`` or ``FAIL CASE: why`` per case; exit status 1 on any failure.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from cases import cases, comm, rank, size  # first: it starts MPI

import numpy as np

from mpirl import run
from mpirl.designs import ga3c, impala, paramserver
from mpirl.kit import actorlearner
from topologies.paramserver import ParameterServer

STEPS, ENVS = 16, 2

#: this rank's record of the case running: the learner's copy per version, the copies
#: taken, the observations trained on, the statistics' count
seen: dict = {}


def digest(wire: np.ndarray) -> str:
    return hashlib.sha256(wire.tobytes()).hexdigest()


def watch_trainer(train):
    def watched(self, records, timer):
        if self.version == 0:
            seen["published"][0] = digest(self.learner.wire)
        out = train(self, records, timer)
        seen["published"][self.version] = digest(self.learner.wire)
        seen["trained"] += len(records) * STEPS * ENVS
        seen["count"] = self.learner.obs_stats.count
        return out
    return watched


def took(version: int, learner) -> None:
    n = learner.params.size
    seen["taken"].append((version, digest(learner.wire)))
    if version > 0 and np.any(learner.wire[n:n + learner.obs_space.shape[0]] != 0):
        seen["moved"] = True


def watch_actor(take_reply):
    def watched(self, timer):
        alive = take_reply(self, timer)
        took(self.version, self.learner)
        return alive
    return watched


def watch_predictor(take_params):
    def watched(self, tag):
        take_params(self, tag)
        if tag == actorlearner.TAG_PARAMS:
            took(self.version, self.learner)
    return watched


def watch_reply(reply):
    def watched(self, worker, buf, **kw):
        seen["published"][f"reply {len(seen['published'])}"] = digest(buf)
        return reply(self, worker, buf, **kw)
    return watched


def watch_pull(pull):
    def watched(self, buf, **kw):
        alive = pull(self, buf, **kw)
        seen["taken"].append((None, digest(buf)))
        n = seen["learner"].params.size
        dim = seen["learner"].obs_space.shape[0]
        seen["moved"] = seen["moved"] or bool(np.any(buf[n:n + dim] != 0))
        return alive
    return watched


def watch_server_fill(fill):
    def watched(self, summary):
        fill(self, summary)
        seen["trained"], seen["count"] = self.book.env_steps, self.learner.obs_stats.count
    return watched


def watch_worker(init):
    def watched(self, cfg, ps, learner, *args, **kw):
        init(self, cfg, ps, learner, *args, **kw)
        seen["learner"] = learner
    return watched


actorlearner.VtraceTrainer.train = watch_trainer(actorlearner.VtraceTrainer.train)
ParameterServer.reply = watch_reply(ParameterServer.reply)
ParameterServer.pull = watch_pull(ParameterServer.pull)
paramserver.Server.fill = watch_server_fill(paramserver.Server.fill)
paramserver.Worker.__init__ = watch_worker(paramserver.Worker.__init__)
impala.ImpalaActor._take_reply = watch_actor(impala.ImpalaActor._take_reply)
ga3c.Predictor._take_params = watch_predictor(ga3c.Predictor._take_params)


def check(case: str, args: list[str], run_dir: Path, travels: bool) -> None:
    seen.clear()
    seen.update(published={}, taken=[], trained=0, count=0.0, moved=False)
    code = run.run_main(["--env", "Pendulum-v1", "--obs-norm", "--total-steps", "1200",
                         "--rollout-steps", str(STEPS), "--num-envs", str(ENVS), "--seed", "3",
                         "--run-dir", str(run_dir), "--run-name", case,
                         *args])
    seen.pop("learner", None)
    every = comm.gather(dict(seen), root=0)
    problems = [] if code == 0 else [f"rank {rank}: exit {code}"]
    if rank == 0:
        problems += verdict(every, travels)
    cases.report(case, problems)


def verdict(every: list[dict], travels: bool) -> list[str]:
    problems = []
    published, trained = {}, sum(record["trained"] for record in every)   # by all learners
    for r, record in enumerate(every):
        if record["trained"] and record["count"] != trained:
            problems.append(f"rank {r}: statistics of {record['count']} observations, "
                            f"{trained} trained on by the learners")
        for version, value in record["published"].items():
            if published.setdefault(version, value) != value:
                problems.append(f"rank {r}: learners differ at version {version}")
    if not published:
        problems.append("no learner update")
    taken = [(r, v, d) for r, record in enumerate(every) for v, d in record["taken"]]
    sent = set(published.values())
    for r, version, value in taken:
        if (value not in sent) if version is None else published.get(version) != value:
            problems.append(f"rank {r} acted with a copy of version {version} that is not "
                            "the learner's")
    if travels and not any(record["moved"] for record in every):
        problems.append("no copy taken after an update carried the statistics")
    return problems


def main() -> int:
    run_dir = Path(sys.argv[1])
    check("impala push", ["--mode", "impala"], run_dir, travels=True)
    check("impala broadcast", ["--mode", "impala", "--param-delivery", "broadcast",
                               "--topology", "ring"], run_dir, travels=True)
    if size >= 4:
        check("impala 2 learners", ["--mode", "impala", "--learners", "2"], run_dir,
              travels=True)
    check("ga3c", ["--mode", "ga3c"], run_dir, travels=True)
    check("seed", ["--mode", "seed"], run_dir, travels=False)
    check("async", ["--mode", "async", "--topology", "star"], run_dir, travels=True)
    check("quorum", ["--mode", "quorum", "--topology", "star"], run_dir, travels=True)
    return 1 if cases.failed else 0


if __name__ == "__main__":
    sys.exit(main())
