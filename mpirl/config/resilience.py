"""Faults, stops, checkpoints, resume and replay: their fields and checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import registry
from ..errors import ConfigError
from ..resilience.faults import NAN_POLICIES, ON_FAILURE, parse_faults
from .checks import at_least, choice, doc
from .design import MODES


@dataclass
class ResilienceFields:
    wait_timeout_s: float = doc(
        "deadline for any single wait on another rank (async/quorum server and workers); "
        "a rank silent for longer stops the run with an error", default=300.0)
    watchdog_s: float = doc(
        "end the whole job when a rank completes no update (nor, in the replay designs' "
        "workers, a rollout; nor, at apex's learner, an actor's request answered) for this "
        "many seconds (a rank "
        "died, hangs or stalls; blocking collectives have no deadline of their own); "
        "0 disables", default=600.0)
    nan_policy: str = doc(
        "a NaN/Inf in a gradient: 'stop' the job naming rank and update, or 'skip' that "
        "update on every rank (counted in summary.json)", default="stop")
    on_failure: str = doc(
        "a rank fails: 'stop' the job (naming it), or 'shrink': the survivors agree, shrink "
        "the communicator and carry on (sync mode; needs ULFM: Open MPI 5 launched with "
        "--with-ft ulfm, see docs/faults.md)", default="stop")
    checkpoint_every: int = doc(
        "every rank writes a checkpoint (parameters, Adam state, RNG, env state): sync and "
        "sync-replay (with its replay) every this many rollouts and at the end, "
        "async/quorum a snapshot every this many server updates; 0 disables (a "
        "SIGTERM/SIGINT stop still writes one)", default=100)
    commit_every: int = doc(
        "elastic training (sync): every this many rollouts the lowest rank on each node "
        "commits the replicated training state to the node's memory ($MPIRL_COMMIT_DIR, "
        "default /dev/shm/mpirl-commits); under a driver (python -m mpirl.cluster exec "
        "--elastic) a job that loses a node restarts on the nodes left from the newest "
        "commit; 0 disables", default=0)
    resume: str = doc(
        "continue the killed or finished run in this run directory from its checkpoints, "
        "to the same total budget (its config.yaml is the base; flags on top)", default="")
    replay_schedule: str = doc(
        "re-run the run in this directory with its recorded order of events enforced "
        "(async, quorum, impala, gorila, seed, ga3c, apex: which push, unroll, request or "
        "batch was taken when); it ends with the recorded parameter SHA-256; the "
        "configuration must be the recorded one",
        default="")
    fail: list = doc(
        "inject a failure, as RANK@UPDATE[:KIND] (repeatable), KIND one of exit (the "
        "process dies), raise, nan (the gradient becomes NaN), hang; for tests and drills",
        default_factory=list)


def check_resilience(cfg, world_size: int) -> None:
    if cfg.replay_schedule:
        _check_replay_schedule(cfg, world_size)
    choice("nan_policy", cfg.nan_policy, NAN_POLICIES)
    choice("on_failure", cfg.on_failure, ON_FAILURE)
    design = registry.design(cfg.mode)
    first = design.roles(cfg, world_size)[0]
    if cfg.on_failure == "shrink" and not design.shrinkable:
        raise ConfigError(f"on_failure='shrink' with mode={cfg.mode!r}: its {first} holds "
                          "the only copy of its state, so its failure cannot be survived; "
                          f"shrink is for mode {' or '.join(registry.modes(shrinkable=True))}")
    at_least("checkpoint_every", cfg.checkpoint_every, 0)
    if cfg.resume:
        _check_resume(cfg, world_size)
    _check_elastic(cfg)
    at_least("watchdog_s", cfg.watchdog_s, 0.0)
    planned = parse_faults(cfg.fail, world_size)
    if not design.guarded and (planned or cfg.nan_policy != "stop"):
        flag = "fail" if planned else f"nan_policy={cfg.nan_policy!r}"
        raise ConfigError(f"{flag} with mode={cfg.mode!r}: its learner checks no gradient "
                          "before it is used, so nothing would act on it; allowed with "
                          f"--fail and --nan-policy skip: mode "
                          f"{', '.join(registry.modes(guarded=True))}")
    if first != "worker" and planned.get(0, (0, ""))[1] == "nan":
        raise ConfigError(f"fail=0@...:nan: rank 0 is the {first} and computes no gradient "
                          "of a worker's; inject nan on a worker (rank >= 1)")
    at_least("wait_timeout_s", cfg.wait_timeout_s, 0.1)


def _check_replay_schedule(cfg, world_size: int) -> None:
    """A recorded run of this very configuration, rank count and a replayable design."""
    from ..resilience.schedule import FREE_FIELDS, REPLAYABLE, deciding_ranks, schedule_path
    from .loading import config_differences, load_yaml

    where = Path(cfg.replay_schedule)
    if cfg.mode not in REPLAYABLE:
        raise ConfigError(f"replay_schedule with mode={cfg.mode!r} (a synchronous run is "
                          "deterministic: nothing to replay); allowed modes: "
                          f"{', '.join(REPLAYABLE)}")
    if cfg.resume:
        raise ConfigError("replay_schedule with resume: a resumed run records only the "
                          "events after its resume; replay the run from its start")
    first = deciding_ranks(cfg, world_size)[0]
    if not (where / "config.yaml").is_file() or not schedule_path(where, first).is_file():
        raise ConfigError(f"replay_schedule={str(where)!r} holds no recorded run (its "
                          f"config.yaml and schedule/rank{first:04d}.npy); give the run "
                          f"directory of a run of one of {', '.join(REPLAYABLE)}")
    _check_recorded_size(where, world_size)
    # a field the recorded run's file lacks (it predates the field) is at its default,
    # which is what that run ran with
    recorded = {k: v for k, v in {**type(cfg)().to_dict(),
                                  **load_yaml(where / "config.yaml")}.items()
                if k not in FREE_FIELDS}
    mine = {k: v for k, v in cfg.to_dict().items() if k not in FREE_FIELDS}
    differences = config_differences(mine, recorded)
    if differences:
        raise ConfigError(f"replay_schedule={str(where)!r} is a run of another "
                          f"configuration: {'; '.join(differences)} (this run vs the recorded "
                          "one)")
    ranks = len(list((where / "schedule").glob("rank*.npy")))
    wanted = len(deciding_ranks(cfg, world_size))
    if ranks != wanted:
        raise ConfigError(f"replay_schedule={str(where)!r} holds {ranks} schedule files, "
                          f"this configuration records {wanted}")


def _check_recorded_size(where: Path, world_size: int) -> None:
    import h5py

    with h5py.File(where / "run.h5", "r") as f:
        recorded = int(f.attrs["world_size"])
    if recorded != world_size:
        raise ConfigError(f"replay_schedule={str(where)!r} was recorded with {recorded} ranks; "
                          f"launch this one with mpirun -np {recorded}, not {world_size}")


def _check_elastic(cfg) -> None:
    from ..resilience.elastic import ATTEMPT_VAR, Launch

    at_least("commit_every", cfg.commit_every, 0)
    launch = Launch.from_env()
    if launch is not None and not cfg.commit_every:
        raise ConfigError("commit_every=0 under an elastic driver (MPIRL_ELASTIC_JOB is set): "
                          "a restart would have no commit to continue from; allowed: "
                          "--commit-every 1 or more")
    if not cfg.commit_every:
        return
    if cfg.mode != "sync":
        raise ConfigError(f"commit_every with mode={cfg.mode!r}: elastic commits hold a "
                          "replicated state, which only sync's ranks all hold; allowed "
                          "with --commit-every: mode sync")
    if cfg.on_failure == "shrink":
        raise ConfigError("commit_every with on_failure='shrink': shrinking survives a rank "
                          "in place, an elastic restart replaces the job; choose one")
    if cfg.resume or cfg.replay_schedule:
        raise ConfigError("commit_every with resume or replay_schedule: an elastic restart "
                          f"continues from node memory ({ATTEMPT_VAR}), not from a run's "
                          "checkpoints; choose one")


def _check_resume(cfg, world_size: int) -> None:
    from ..resilience.checkpoint import generations, latest_complete

    ckpt = Path(cfg.resume) / "checkpoints"
    kind = registry.design(cfg.mode).checkpoints
    if kind is None:
        allowed = [m for m in MODES if registry.design(m).checkpoints]
        raise ConfigError(f"resume with mode={cfg.mode!r}: it writes no checkpoints yet; "
                          f"allowed with --resume: {', '.join(allowed)}")
    if kind == "snapshots":
        if latest_complete(cfg.resume, world_size) is None:
            have = generations(cfg.resume)
            raise ConfigError(
                f"resume={cfg.resume!r}: no checkpoint generation that all "
                f"{world_size} ranks wrote (found generations {have or 'none'} in "
                f"{ckpt}); resume with the rank count the run was started with")
        return
    missing = [r for r in range(world_size) if not (ckpt / f"rank{r:04d}.pt").is_file()]
    if missing:
        have = sorted(p.name for p in ckpt.glob("rank*.pt")) if ckpt.is_dir() else []
        raise ConfigError(f"resume={cfg.resume!r}: no checkpoint for ranks {missing} "
                          f"(found {len(have)}: {', '.join(have) or 'none'}); resume with "
                          "the rank count the run was started with")
    extra = sorted(p.name for p in ckpt.glob("rank*.pt")
                   if p.stem[4:].isdigit() and int(p.stem[4:]) >= world_size)
    if extra:
        raise ConfigError(f"resume={cfg.resume!r}: checkpoints of more ranks than "
                          f"{world_size} ({', '.join(extra[:3])}); resume with the rank "
                          "count the run was started with")
