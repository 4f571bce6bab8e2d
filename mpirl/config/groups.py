"""The configuration's fields, grouped by concern, each group with its one check.

Keys stay flat (``cfg.lr``, ``--lr``, ``lr:`` in YAML, a sweep's grid key): the groups
only decide where a field is defined and checked.  :class:`mpirl.config.Config` is all
of them at once.  Every check names the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("sync", "async", "quorum", "impala", "seed", "ga3c", "apex",
         "gorila")                                  # mpirl.designs.DESIGNS
GRADIENT_MODES = ("sync", "async", "quorum", "gorila")   # what travels: gradients
#: unrolls, observations and actions, transitions: a learner rank, actors elsewhere
ACTOR_LEARNER_MODES = ("impala", "seed", "ga3c", "apex")
#: the value-based designs (n-step double DQN over a replay)
DQN_MODES = ("apex", "gorila")
GORILA_REPLAY = ("local", "service")
REFRESH = ("unroll", "updates", "episode")
INFERENCE_POLICIES = ("auto", "fixed", "drain")
DEVICES = ("cpu", "cuda")
LATE_POLICIES = ("drop", "apply")
ACTIVATIONS = ("tanh", "relu", "elu")
NAN_POLICIES = ("stop", "skip")
ON_FAILURE = ("stop", "shrink")
FAIL_KINDS = ("exit", "raise", "nan", "hang")


class ConfigError(ValueError):
    """A configuration value, key or file that cannot be used; the message says why."""


class FaultSpecError(ConfigError):
    """A ``--fail`` entry that cannot be parsed or names a rank that does not exist."""


def _doc(text: str, **kw):
    return field(metadata={"help": text}, **kw)


# -- what is compared ---------------------------------------------------------------------------
@dataclass
class DesignFields:
    topology: str = _doc("gradient exchange, a name registered in topologies/", default="butterfly")
    mode: str = _doc(
        "training design: sync (every rank computes a gradient, all are averaged by the "
        "topology's allreduce, every rank steps: A2C/DPPO); async (rank 0 is a parameter "
        "server that applies each worker's gradient on arrival and answers that worker "
        "alone: A3C; needs topology star); quorum (the server waits for --quorum fresh "
        "gradients, averages them, steps and answers: DPPO's leader; needs topology star); "
        "impala, seed, ga3c (actor-learner designs, docs/actor-learner.md); apex, gorila "
        "(n-step double DQN over prioritized replay ranks / sharded parameter servers, "
        "docs/replay-designs.md)", default="sync")
    quorum: int = _doc("quorum mode: fresh gradients the server waits for per update; "
                       "0 = half the workers, rounded up", default=0)
    late: str = _doc("quorum mode: a gradient computed on old parameters is 'drop'ped or "
                     "'apply'd with the fresh ones (counted and logged either way)",
                     default="drop")
    straggler: list = _doc(
        "slow ranks, as RANK:FACTOR (repeatable): after each rollout the rank idles "
        "(FACTOR-1) times as long as the rollout took", default_factory=list)


def check_design(cfg, world_size: int) -> None:
    import topologies

    choice("mode", cfg.mode, MODES)
    choice("topology", cfg.topology, topologies.names())
    choice("late", cfg.late, LATE_POLICIES)
    if cfg.mode in ("async", "quorum"):
        if cfg.topology != "star":
            raise ConfigError(
                f"mode={cfg.mode!r} runs a parameter server, the star topology used "
                f"asynchronously; topology={cfg.topology!r} is not allowed with it "
                "(use --topology star, or --mode sync)")
        if world_size < 2:
            raise ConfigError(f"mode={cfg.mode!r} needs at least 2 ranks (a server and a "
                              f"worker), got {world_size}; launch with mpirun -np 2 or more")
    if cfg.mode == "quorum" and not 0 <= cfg.quorum <= world_size - 1:
        raise ConfigError(f"quorum={cfg.quorum}; allowed with {world_size} ranks: "
                          f"0..{world_size - 1} (0 = half the workers)")
    for rank in parse_stragglers(cfg.straggler):
        if rank >= world_size:
            raise ConfigError(f"straggler rank {rank} does not exist; allowed ranks: "
                              f"0..{world_size - 1}")


def parse_stragglers(specs: list) -> dict[int, float]:
    """``["1:3", "2:1.5"]`` -> ``{1: 3.0, 2: 1.5}``; malformed entries raise ConfigError."""
    out: dict[int, float] = {}
    for spec in specs:
        try:
            rank_text, factor_text = str(spec).split(":")
            rank, factor = int(rank_text), float(factor_text)
        except ValueError:
            raise ConfigError(f"straggler={spec!r}; expected RANK:FACTOR, e.g. 1:3") from None
        if rank < 0 or not 1.0 <= factor < math.inf:
            raise ConfigError(f"straggler={spec!r}; allowed: RANK >= 0 and a finite FACTOR >= 1")
        out[rank] = factor
    return out


# -- actor-learner designs: impala, seed, ga3c --------------------------------------------------
@dataclass
class ActorLearnerFields:
    learners: int = _doc("impala: learner ranks (0..L-1); they average their gradients with "
                         "the topology's allreduce; every other rank is an actor", default=1)
    unroll_batch: int = _doc("unrolls per learner update (impala, seed; ga3c: the "
                             "trainer's batch); 0 = one per actor the learner serves",
                             default=0)
    param_refresh: str = _doc(
        "impala: when an actor gets fresh parameters with the reply to its unroll: "
        "'unroll' (every unroll, the paper), 'updates' (once the learner is "
        "--refresh-every updates ahead of the actor's copy), 'episode' (when one of the "
        "actor's episodes ended in the unroll: fetch before the next game)", default="unroll")
    refresh_every: int = _doc("impala, --param-refresh updates: K", default=1)
    max_policy_lag: int = _doc("impala/seed/ga3c: unrolls whose parameters are more than "
                               "this many updates old are dropped (counted); 0 = no bound",
                               default=0)
    rho_bar: float = _doc("V-trace: clip of the importance weight in the targets; 0 = none",
                          default=1.0)
    c_bar: float = _doc("V-trace: clip of the trace-cutting weights c; 0 = none", default=1.0)
    pg_rho_bar: float = _doc("V-trace: clip of the weight in the policy gradient; 0 = none",
                             default=1.0)
    vtrace_lambda: float = _doc("V-trace: lambda multiplying the c weights", default=1.0)
    inference_policy: str = _doc(
        "seed/ga3c inference batching: 'fixed' (wait for --inference-batch observations, "
        "seed_rl), 'drain' (take what has arrived, waiting at most --inference-wait-s for "
        "more: GA3C's predictor); auto = fixed for seed, drain for ga3c", default="auto")
    inference_batch: int = _doc(
        "seed/ga3c: observations per forward pass (fixed: exactly, rounded up to whole "
        "actors; drain: at most); 0 = half the actors' envs (fixed), all of them (drain)",
        default=0)
    inference_wait_s: float = _doc("drain batching: longest wait for more requests once "
                                   "one has arrived", default=0.002)
    learner_device: str = _doc("device of the learner and inference ranks: cpu (cuda is "
                               "checked and refused: not built yet)", default="cpu")


def check_actor_learner(cfg, world_size: int) -> None:
    choice("param_refresh", cfg.param_refresh, REFRESH)
    choice("inference_policy", cfg.inference_policy, INFERENCE_POLICIES)
    choice("learner_device", cfg.learner_device, DEVICES)
    for name in ("unroll_batch", "max_policy_lag"):
        at_least(name, getattr(cfg, name), 0)
    for name in ("learners", "refresh_every"):
        at_least(name, getattr(cfg, name), 1)
    for name in ("rho_bar", "c_bar", "pg_rho_bar"):
        at_least(name, getattr(cfg, name), 0.0)
    in_range("vtrace_lambda", cfg.vtrace_lambda, 0.0, 1.0)
    at_least("inference_wait_s", cfg.inference_wait_s, 0.0)
    at_least("inference_batch", cfg.inference_batch, 0)
    if cfg.mode in ACTOR_LEARNER_MODES:
        _check_wiring(cfg, world_size)


def _check_wiring(cfg, world_size: int) -> None:
    """The rank counts, batch and device an actor-learner design can run with."""
    servers = {"impala": cfg.learners, "seed": 1, "ga3c": 2,
               "apex": 1 + cfg.replay_ranks}[cfg.mode]
    if world_size <= servers:
        what = {"impala": f"learners={cfg.learners}", "seed": "1 learner",
                "ga3c": "a trainer and a predictor",
                "apex": f"1 learner and replay_ranks={cfg.replay_ranks}"}[cfg.mode]
        raise ConfigError(f"mode={cfg.mode!r} with {what} needs at least {servers + 1} ranks "
                          f"(one actor or more), got {world_size}"
                          + ("; lower --learners" if cfg.mode == "impala" else
                             f"; launch with mpirun -np {servers + 1} or more"))
    if cfg.resume:
        raise ConfigError(f"resume with mode={cfg.mode!r}: the actor-learner designs write no "
                          "checkpoints yet; allowed with --resume: sync, async, quorum")
    if cfg.mode == "apex" and cfg.replay_ranks > world_size - servers:
        raise ConfigError(f"replay_ranks={cfg.replay_ranks} with {world_size} ranks leaves "
                          f"{world_size - servers} actors, and every replay rank needs one; "
                          f"allowed: 1..{(world_size - 1) // 2}")
    if cfg.mode == "impala" and cfg.learners > world_size - cfg.learners:
        raise ConfigError(f"learners={cfg.learners} with {world_size} ranks leaves "
                          f"{world_size - cfg.learners} actors, and every learner needs one; "
                          f"allowed: 1..{world_size // 2}")
    if cfg.learners != 1 and cfg.mode != "impala":
        raise ConfigError(f"learners={cfg.learners} with mode={cfg.mode!r}; allowed: 1 "
                          "(several learners are impala's)")
    actors_envs = (world_size - servers) * cfg.num_envs
    if cfg.mode in ("seed", "ga3c") and cfg.inference_mode() == "fixed" and \
            cfg.inference_batch > actors_envs:
        raise ConfigError(f"inference_batch={cfg.inference_batch} with fixed-size batching "
                          f"can never fill: {world_size - servers} actors x num_envs "
                          f"{cfg.num_envs} = {actors_envs} observations at most; allowed: "
                          f"0..{actors_envs}")
    if cfg.learner_device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("learner_device='cuda' but torch sees no GPU on this machine; "
                              "allowed here: cpu")
        # the learner's flat parameter and gradient buffers are host memory that the
        # channels and topologies send in place; a device copy is not built yet
        raise ConfigError("learner_device='cuda' is not supported yet (the learner's flat "
                          "buffers live in host memory); allowed: cpu")


# -- value-based designs: replay, DQN, sharded parameter server --------------------------------
@dataclass
class ReplayFields:
    replay_ranks: int = _doc("apex: replay ranks (1..R), each holding the transitions of its "
                             "actors (sharded by actor)", default=1)
    replay_capacity: int = _doc("apex/gorila: transitions a replay holds (apex: over all "
                                "shards, split evenly); FIFO eviction", default=50_000)
    replay_alpha: float = _doc("prioritized replay: priority exponent alpha (0 = uniform)",
                               default=0.6)
    replay_beta: float = _doc("prioritized replay: importance-sampling exponent beta at the "
                              "start", default=0.4)
    beta_anneal_steps: int = _doc("learner updates over which beta anneals linearly to 1; "
                                  "0 = constant", default=0)
    replay_eps: float = _doc("prioritized replay: epsilon added to |TD error|", default=1e-6)
    replay_batch: int = _doc("apex/gorila: transitions per learner update", default=256)
    learning_starts: int = _doc("apex/gorila: transitions stored (over all shards) before "
                                "learning starts", default=1000)
    train_intensity: float = _doc(
        "apex: the most transitions sampled per transition inserted, per shard (RLlib's "
        "training_intensity); the shard holds the learner's request until it may sample; "
        "0 = no bound", default=0.0)
    n_step: int = _doc("apex/gorila: n of the n-step returns", default=3)
    dueling: bool = _doc("apex/gorila: dueling Q-network head", default=False)
    target_update: int = _doc("apex/gorila: learner updates (gorila: a worker's pushes) "
                              "between target-network copies", default=100)
    actor_refresh_steps: int = _doc("apex: env steps an actor takes between parameter "
                                    "refreshes (rounded up to whole rollouts)", default=400)
    apex_eps: float = _doc("apex: per-actor epsilon base: actor i of N acts with "
                           "eps**(1 + alpha*i/(N-1))", default=0.4)
    apex_eps_alpha: float = _doc("apex: per-actor epsilon exponent alpha", default=7.0)
    servers: int = _doc("gorila, async: parameter-server ranks (0..S-1) holding contiguous "
                        "shards of the flat parameter vector", default=1)
    gorila_replay: str = _doc("gorila: 'local' (each actor-learner's own replay) or "
                              "'service' (--replay-ranks replay ranks after the servers, "
                              "as apex's)", default="local")


def check_replay(cfg, world_size: int) -> None:
    choice("gorila_replay", cfg.gorila_replay, GORILA_REPLAY)
    for name in ("replay_ranks", "replay_capacity", "replay_batch", "n_step", "target_update",
                 "actor_refresh_steps", "servers"):
        at_least(name, getattr(cfg, name), 1)
    for name in ("beta_anneal_steps", "learning_starts"):
        at_least(name, getattr(cfg, name), 0)
    for name in ("replay_alpha", "train_intensity", "apex_eps_alpha"):
        at_least(name, getattr(cfg, name), 0.0)
    in_range("replay_beta", cfg.replay_beta, 0.0, 1.0)
    in_range("replay_eps", cfg.replay_eps, 0.0, 1.0, low_open=True)
    in_range("apex_eps", cfg.apex_eps, 0.0, 1.0)
    if cfg.mode in DQN_MODES:
        shards = cfg.replay_ranks if cfg.mode == "apex" or gorila_service(cfg) else 1
        if cfg.replay_capacity // shards < cfg.replay_batch:
            raise ConfigError(
                f"replay_capacity={cfg.replay_capacity} over {shards} replay shard(s) holds "
                f"{cfg.replay_capacity // shards} each, less than replay_batch="
                f"{cfg.replay_batch}; allowed: replay_capacity >= "
                f"{shards * cfg.replay_batch}")
    if cfg.mode in DQN_MODES:
        _check_discrete(cfg)
    _check_servers(cfg, world_size)
    if gorila_service(cfg) and cfg.replay_ranks > world_size - cfg.servers - cfg.replay_ranks:
        raise ConfigError(f"replay_ranks={cfg.replay_ranks} with servers={cfg.servers} and "
                          f"{world_size} ranks leaves "
                          f"{max(0, world_size - cfg.servers - cfg.replay_ranks)} workers, and "
                          f"every replay rank needs one; allowed: 1.."
                          f"{max(1, (world_size - cfg.servers) // 2)}")


def gorila_service(cfg) -> bool:
    """gorila with replay ranks (``--gorila-replay service``)."""
    return cfg.mode == "gorila" and cfg.gorila_replay == "service"


def _check_discrete(cfg) -> None:
    """A Q-network needs a discrete action space (unknown env ids: check_env says so)."""
    import gymnasium

    from ..parts.envs import check_env_args   # registers L2Run-v0 and Delay-v0

    if cfg.env not in gymnasium.registry:
        return
    if cfg.env == "L2Run-v0":
        space = "Box (muscle excitations)"           # not built here: OpenSim is slow
    else:
        try:
            check_env_args(cfg.env, cfg.env_kwargs())
        except ValueError:
            return                                   # check_env names the argument
        env = gymnasium.make(cfg.env, **cfg.env_kwargs())
        space = env.action_space
        env.close()
        if isinstance(space, gymnasium.spaces.Discrete):
            return
    raise ConfigError(f"mode={cfg.mode!r} learns a Q-network and needs a discrete action "
                      f"space; env={cfg.env!r} has {space}; allowed: an env with a Discrete "
                      "action space, e.g. CartPole-v1 or Delay-v0 with --env-arg actions=5")


def _check_servers(cfg, world_size: int) -> None:
    if cfg.servers > 1 and cfg.mode not in ("async", "gorila"):
        raise ConfigError(f"servers={cfg.servers} with mode={cfg.mode!r}; allowed: 1 (sharded "
                          "parameter servers are gorila's and async's)")
    if cfg.mode in ("async", "gorila") and cfg.servers >= world_size:
        raise ConfigError(f"servers={cfg.servers} with {world_size} ranks leaves no worker; "
                          f"allowed: 1..{max(1, world_size - 1)}")
    if cfg.mode == "async" and cfg.servers > 1 and cfg.checkpoint_every:
        raise ConfigError(f"servers={cfg.servers} with checkpoint_every="
                          f"{cfg.checkpoint_every}: sharded servers take no checkpoint "
                          "snapshots yet; allowed: --checkpoint-every 0, or --servers 1")


# -- environment and budget ---------------------------------------------------------------------
@dataclass
class EnvFields:
    env: str = _doc("gymnasium environment id; also mpirl's own L2Run-v0 (Learning to Run on "
                    "OpenSim) and Delay-v0 (a synthetic env with a tunable step cost)",
                    default="CartPole-v1")
    env_arg: list = _doc(
        "argument of L2Run-v0 or Delay-v0 as KEY=VALUE (repeatable), e.g. difficulty=2, "
        "cost_s=0.01, dist=lognormal", default_factory=list)
    seed: int = _doc("base seed; rank r seeds its env with seed + 10000*r", default=1)
    total_steps: int = _doc("env steps summed over all ranks before the run stops",
                            default=200_000)
    num_envs: int = _doc("environments stepped in lock-step on each rank", default=4)
    rollout_steps: int = _doc("steps per environment between updates (the n of n-step returns)",
                              default=16)


def check_env(cfg, world_size: int) -> None:
    import gymnasium

    from ..parts.envs import check_env_args   # registers L2Run-v0, Delay-v0 (no OpenSim)

    if cfg.env not in gymnasium.registry:
        close = [e for e in gymnasium.registry if cfg.env.split("-")[0].lower() in e.lower()]
        hint = f" (did you mean {', '.join(close[:5])}?)" if close else ""
        raise ConfigError(f"env={cfg.env!r} is not a registered gymnasium id{hint}")
    try:
        check_env_args(cfg.env, cfg.env_kwargs())
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name in ("total_steps", "num_envs", "rollout_steps"):
        at_least(name, getattr(cfg, name), 1)


def check_budget(cfg, world_size: int) -> None:
    """The budget holds at least one update (after every group's own check)."""
    workers = cfg.experience_ranks(world_size)
    per_update = workers * cfg.num_envs * cfg.rollout_steps * cfg.action_repeat
    if cfg.total_steps < per_update:
        raise ConfigError(
            f"total_steps={cfg.total_steps} is less than one update "
            f"({workers} experience-collecting ranks x num_envs {cfg.num_envs} x "
            f"rollout_steps {cfg.rollout_steps} x action_repeat {cfg.action_repeat} = "
            f"{per_update}); raise total_steps")


# -- learner ------------------------------------------------------------------------------------
@dataclass
class LearnerFields:
    lr: float = _doc("Adam learning rate", default=1e-3)
    gamma: float = _doc("discount factor", default=0.99)
    gae_lambda: float = _doc("GAE lambda; 1.0 gives plain n-step returns", default=0.95)
    value_coef: float = _doc("weight of the value loss", default=0.5)
    entropy_coef: float = _doc("weight of the entropy bonus", default=0.01)
    clip_ratio: float = _doc("PPO clipped objective with this epsilon (DPPO; pair it with "
                             "--update-repeat); 0 = plain advantage actor-critic",
                             default=0.0)
    max_grad_norm: float = _doc("clip the averaged gradient to this norm; 0 disables",
                                default=0.5)
    hidden: list = _doc("hidden layer widths of the actor-critic MLP",
                        default_factory=lambda: [64, 64])
    activation: str = _doc("hidden activation: tanh, relu or elu", default="tanh")
    layer_norm: bool = _doc("layer normalisation after every hidden layer", default=False)
    reward_scale: bool = _doc("divide each batch's rewards by their standard deviation",
                              default=False)
    action_repeat: int = _doc("apply each action this many times (rewards summed)", default=1)
    update_repeat: int = _doc("learn each batch this many times (a fresh gradient each time)",
                              default=1)


def check_learner(cfg, world_size: int) -> None:
    choice("activation", cfg.activation, ACTIVATIONS)
    for name in ("action_repeat", "update_repeat"):
        at_least(name, getattr(cfg, name), 1)
    in_range("lr", cfg.lr, 0.0, 1.0, low_open=True)
    in_range("gamma", cfg.gamma, 0.0, 1.0)
    in_range("gae_lambda", cfg.gae_lambda, 0.0, 1.0)
    in_range("clip_ratio", cfg.clip_ratio, 0.0, 1.0)
    for name in ("value_coef", "entropy_coef", "max_grad_norm"):
        at_least(name, getattr(cfg, name), 0.0)
    if not cfg.hidden or not all(type(h) is int and h > 0 for h in cfg.hidden):
        raise ConfigError(f"hidden={cfg.hidden!r}; allowed: a non-empty list of positive ints")


# -- bookkeeping: run files, progress, logs -----------------------------------------------------
@dataclass
class TelemetryFields:
    run_dir: str = _doc("parent directory of run directories", default="runs")
    run_name: str = _doc("name of this run's directory (default: topology-mode-Nranks-time)",
                         default="")
    log_every: int = _doc(
        "progress line every this many rollouts (sync: rank 0) or server updates "
        "(async, quorum)", default=20)
    target_return: float = _doc(
        "stop early once every experience-collecting rank has finished 20 episodes and the "
        "mean over ranks of their last-20-episode mean return reaches this (checked at "
        "each progress line); 0 disables", default=0.0)
    log_flush_every: int = _doc(
        "HDF5 log rows buffered before they are written and flushed; a crash loses at "
        "most this many rows per rank", default=50)
    checksum_every: int = _doc(
        "compare a checksum of parameters and optimizer state across ranks every this many "
        "updates; a mismatch stops the run; 0 disables", default=50)
    torch_threads: int = _doc("torch threads per rank; 0 = cores / ranks sharing them (on an "
                              "emulated cluster: every rank of the job)",
                              default=0)


def check_telemetry(cfg, world_size: int) -> None:
    for name in ("log_every", "log_flush_every"):
        at_least(name, getattr(cfg, name), 1)
    for name in ("checksum_every", "torch_threads"):
        at_least(name, getattr(cfg, name), 0)


# -- faults, stops and checkpoints --------------------------------------------------------------
@dataclass
class ResilienceFields:
    wait_timeout_s: float = _doc(
        "deadline for any single wait on another rank (async/quorum server and workers); "
        "a rank silent for longer stops the run with an error", default=300.0)
    watchdog_s: float = _doc(
        "end the whole job when a rank completes no update for this many seconds (a rank "
        "died, hangs or stalls; blocking collectives have no deadline of their own); "
        "0 disables", default=600.0)
    nan_policy: str = _doc(
        "a NaN/Inf in a gradient: 'stop' the job naming rank and update, or 'skip' that "
        "update on every rank (counted in summary.json)", default="stop")
    on_failure: str = _doc(
        "a rank fails: 'stop' the job (naming it), or 'shrink': the survivors agree, shrink "
        "the communicator and carry on (sync mode; needs ULFM: Open MPI 5 launched with "
        "--with-ft ulfm, see docs/faults.md)", default="stop")
    checkpoint_every: int = _doc(
        "every rank writes a checkpoint (parameters, Adam state, RNG, env state): sync "
        "every this many rollouts and at the end, async/quorum a snapshot every this many "
        "server updates; 0 disables (a SIGTERM/SIGINT stop still writes one)", default=100)
    resume: str = _doc(
        "continue the killed or finished run in this run directory from its checkpoints, "
        "to the same total budget (its config.yaml is the base; flags on top)", default="")
    replay_schedule: str = _doc(
        "re-run the run in this directory with its recorded order of events enforced "
        "(async, quorum, impala, gorila, seed, ga3c, apex: which push, unroll, request or "
        "batch was taken when); it ends with the recorded parameter SHA-256; the "
        "configuration must be the recorded one",
        default="")
    fail: list = _doc(
        "inject a failure, as RANK@UPDATE[:KIND] (repeatable), KIND one of exit (the "
        "process dies), raise, nan (the gradient becomes NaN), hang; for tests and drills",
        default_factory=list)


def check_resilience(cfg, world_size: int) -> None:
    if cfg.replay_schedule:
        _check_replay_schedule(cfg, world_size)
    choice("nan_policy", cfg.nan_policy, NAN_POLICIES)
    choice("on_failure", cfg.on_failure, ON_FAILURE)
    if cfg.on_failure == "shrink" and cfg.mode != "sync":
        raise ConfigError(f"on_failure='shrink' with mode={cfg.mode!r}: the parameter "
                          "server holds the only copy of the parameters, so its failure "
                          "cannot be survived; shrink is for mode sync")
    at_least("checkpoint_every", cfg.checkpoint_every, 0)
    if cfg.resume:
        _check_resume(cfg, world_size)
    at_least("watchdog_s", cfg.watchdog_s, 0.0)
    planned = parse_faults(cfg.fail, world_size)
    if cfg.mode != "sync" and planned.get(0, (0, ""))[1] == "nan":
        raise ConfigError("fail=0@...:nan: rank 0 is the parameter server and computes no "
                          "gradient; inject nan on a worker (rank >= 1)")
    at_least("wait_timeout_s", cfg.wait_timeout_s, 0.1)


def _check_replay_schedule(cfg, world_size: int) -> None:
    """A recorded run of this very configuration, rank count and a replayable design."""
    from ..resilience.schedule import FREE_FIELDS, REPLAYABLE, deciding_ranks, schedule_path
    from . import config_differences, load_yaml

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
    recorded = {k: v for k, v in load_yaml(where / "config.yaml").items()
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


def _check_resume(cfg, world_size: int) -> None:
    from ..resilience.checkpoint import generations, latest_complete

    ckpt = Path(cfg.resume) / "checkpoints"
    if cfg.mode != "sync":
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


def parse_faults(specs: list, world_size: int | None = None) -> dict[int, tuple[int, str]]:
    """``["2@5", "1@3:nan"]`` -> ``{2: (5, "exit"), 1: (3, "nan")}``."""
    out: dict[int, tuple[int, str]] = {}
    for spec in specs:
        text = str(spec)
        where, _, kind = text.partition(":")
        kind = kind or "exit"
        try:
            rank_text, update_text = where.split("@")
            rank, update = int(rank_text), int(update_text)
        except ValueError:
            raise FaultSpecError(f"fail={text!r}; expected RANK@UPDATE[:KIND], e.g. 1@10:exit"
                                 ) from None
        if kind not in FAIL_KINDS:
            raise FaultSpecError(f"fail={text!r}: kind {kind!r}; allowed: "
                                 f"{', '.join(FAIL_KINDS)}")
        if rank < 0 or update < 1:
            raise FaultSpecError(f"fail={text!r}; allowed: RANK >= 0 and UPDATE >= 1")
        if world_size is not None and rank >= world_size:
            raise FaultSpecError(f"fail={text!r}: rank {rank} does not exist; allowed ranks: "
                                 f"0..{world_size - 1}")
        out[rank] = (update, kind)
    return out


#: the groups' checks, in the order a configuration is validated
CHECKS = (check_design, check_actor_learner, check_replay, check_learner, check_telemetry,
          check_resilience, check_env, check_budget)


# -- value checks shared by the groups -----------------------------------------------------------
def choice(name, value, allowed):
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def at_least(name, value, low):
    if not value >= low:             # NaN is not >= anything: refused too
        raise ConfigError(f"{name}={value!r}; allowed: >= {low}")


def in_range(name, value, low, high, low_open=False):
    ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ConfigError(f"{name}={value!r}; allowed: {bracket}{low}, {high}]")
