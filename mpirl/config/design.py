"""What is compared: the design (``--mode``), its exchange (``--topology``), the quorum
and stragglers; and the ranks a design's wiring needs (:mod:`mpirl.registry`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import registry
from ..errors import ConfigError
from .checks import at_least, choice, doc

#: the ``--mode`` names, from the design registry (its rows decide every per-design check)
MODES = registry.MODES
LATE_POLICIES = ("drop", "apply")


@dataclass
class DesignFields:
    topology: str = doc("gradient exchange, a name registered in topologies/", default="butterfly")
    inner: str = doc("topology hierarchical: the node leaders' exchange, any other "
                     "registered topology", default="ring")
    node_size: int = doc("topology hierarchical: nodes of this many consecutive ranks (to "
                         "study the two levels on one machine); 0 = the ranks that share "
                         "memory", default=0)
    cost_params: str = doc("topology auto: the params.json of python -m mpirl.costmodel "
                           "-o DIR (this machine's or cluster's fit); empty = the built-in "
                           "shared-memory fit", default="")
    compress: str = doc("gradient compression around the topology's allreduce: none; fp16 "
                        "or bf16 (summed in half precision, divided by the rank count before "
                        "the cast, as DDP's fp16 hook); topk[:RATIO] (the top RATIO of "
                        "entries, default 0.01) or powersgd[:RANK] (rank-RANK products per "
                        "weight matrix, default 2), both with error feedback, their residuals "
                        "in the checkpoints; parameters are always sent exactly",
                        default="none")
    overlap: bool = doc("sync: exchange the gradient in buckets while backward still "
                        "computes it (DDP's bucket_cap_mb, Horovod's fusion buffer): each "
                        "bucket's allreduce starts, on a thread of its own, once backward has "
                        "filled it", default=False)
    bucket_mb: float = doc("--overlap: MiB of gradient per bucket (whole tensors, from the "
                           "last layer back)", default=1.0)
    one_step_stale: bool = doc("sync: collect the next rollout while the last gradient is "
                               "still averaged (on the exchange's thread); each rollout is "
                               "then learnt with parameters one update newer than those "
                               "that collected it; one update per rollout", default=False)
    mode: str = doc(
        "training design: " + ", ".join(registry.DESIGNS) + " (each described above; "
        "docs/modes.md)", default="sync")
    quorum: int = doc("quorum mode: fresh gradients the server waits for per update; "
                       "0 = half the workers, rounded up", default=0)
    late: str = doc("quorum mode: a gradient computed on old parameters is 'drop'ped or "
                     "'apply'd with the fresh ones (counted and logged either way)",
                     default="drop")
    straggler: list = doc(
        "slow ranks, as RANK:FACTOR (repeatable): after each rollout the rank idles "
        "(FACTOR-1) times as long as the rollout took", default_factory=list)


def check_design(cfg, world_size: int) -> None:
    import topologies

    choice("mode", cfg.mode, MODES)
    choice("topology", cfg.topology, topologies.names())
    check_topology_options(cfg)
    choice("late", cfg.late, LATE_POLICIES)
    design = registry.design(cfg.mode)
    if design.topology_use == "star" and cfg.topology != "star":
        raise ConfigError(
            f"mode={cfg.mode!r} runs a parameter server, the star topology used "
            f"asynchronously; topology={cfg.topology!r} is not allowed with it "
            "(use --topology star, or --mode sync)")
    check_own_options(cfg, design)
    check_overlap(cfg)
    if "quorum" in design.options and not 0 <= cfg.quorum <= world_size - 1:
        raise ConfigError(f"quorum={cfg.quorum}; allowed with {world_size} ranks: "
                          f"0..{world_size - 1} (0 = half the workers)")
    for rank in parse_stragglers(cfg.straggler):
        if rank >= world_size:
            raise ConfigError(f"straggler rank {rank} does not exist; allowed ranks: "
                              f"0..{world_size - 1}")


#: topology -> its options and their defaults (the options make ``Config.topology_spec``)
TOPOLOGY_OPTIONS = {"hierarchical": {"inner": "ring", "node_size": 0},
                    "auto": {"cost_params": ""}}


def check_topology_options(cfg) -> None:
    """A topology's options (``--inner``, ``--node-size``, ``--cost-params``) are given
    only with it, and name a variant that can be built."""
    import topologies

    for topology, options in TOPOLOGY_OPTIONS.items():
        for name, default in options.items():
            if cfg.topology != topology and getattr(cfg, name) != default:
                raise ConfigError(f"{name}={getattr(cfg, name)!r} applies to topology "
                                  f"{topology} only; topology={cfg.topology!r}")
    if cfg.topology == "hierarchical":
        choice("inner", cfg.inner, [n for n in topologies.names() if n != "hierarchical"])
        at_least("node_size", cfg.node_size, 0)
    name, _, option = cfg.compress.partition(":")
    choice("compress", name, ["none", *topologies.wrappers()])
    takes = name != "none" and topologies.get(name).option_name
    if option and not (takes and option.replace(".", "", 1).isdigit()):
        raise ConfigError(f"compress={cfg.compress!r}: " + (
            f"{name} takes no option" if not takes else f"{name}'s {takes} is a decimal number")
            + "; allowed: fp16, bf16, topk[:RATIO], powersgd[:RANK]")
    use = registry.design(cfg.mode).topology_use
    allreduces = use == "allreduce" or (use == "learners" and cfg.learners > 1)
    if cfg.compress != "none" and not allreduces:
        takers = [d.name + (" with --learners > 1" if d.topology_use == "learners" else "")
                  for d in registry.DESIGNS.values() if d.topology_use in ("allreduce",
                                                                           "learners")]
        raise ConfigError(f"compress={cfg.compress!r} compresses a topology's allreduce, and "
                          f"this run has none (mode={cfg.mode!r}); allowed with mode "
                          f"{', '.join(takers)} (every other run: compress none)")
    try:
        topologies.get(cfg.topology_spec)
        topologies.check_env()
    except topologies.TopologyError as err:
        raise ConfigError(str(err)) from None


def check_overlap(cfg) -> None:
    """``--overlap`` and its bucket size, and ``--one-step-stale`` (mode sync only:
    check_own_options)."""
    if not cfg.bucket_mb > 0:            # NaN too
        raise ConfigError(f"bucket_mb={cfg.bucket_mb!r}; allowed: a size in MiB > 0 (each "
                          "bucket's share of the gradient, e.g. 1 or 0.25)")
    if cfg.bucket_mb != 1.0 and not cfg.overlap:
        raise ConfigError(f"bucket_mb={cfg.bucket_mb!r} sizes --overlap's buckets; this run "
                          "has no --overlap (add it, or leave bucket_mb at 1.0)")
    if cfg.one_step_stale and (cfg.minibatches, cfg.update_repeat) != (1, 1):
        raise ConfigError(f"one_step_stale with minibatches={cfg.minibatches}, "
                          f"update_repeat={cfg.update_repeat}: one gradient is held in flight "
                          "per rollout; allowed: minibatches 1 and update_repeat 1 with it")
    if not (cfg.overlap or cfg.one_step_stale):
        return
    flag = "overlap" if cfg.overlap else "one_step_stale"   # both run the exchange thread
    if cfg.on_failure == "shrink":
        raise ConfigError(f"{flag} with on_failure='shrink' is not supported (an exchange "
                          "on its thread redone after a failure would need every one "
                          "redone); allowed: on_failure stop")
    if cfg.compress.partition(":")[0] in ("topk", "powersgd"):
        raise ConfigError(f"{flag} with compress={cfg.compress!r} is not supported (error "
                          "feedback keeps one residual per gradient buffer, not per bucket); "
                          "allowed: compress none, fp16, bf16")


#: design options checked elsewhere, with their own messages: PPO's (check_learner) and
#: those that size a role (check_wiring)
CHECKED_ELSEWHERE = ("minibatches", "obs_norm", "anneal_lr", "norm_adv", "reward_norm",
                     "clip_vloss", "reward_scale", "learners", "servers", "replay_ranks")


def check_own_options(cfg, design) -> None:
    """A design's own options (its registry row's ``options``) keep their defaults under
    every other design: set there, they would play no part, silently."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name in sorted({o for d in registry.DESIGNS.values() for o in d.options}):
        if name in CHECKED_ELSEWHERE or name in design.options:
            continue
        value = getattr(cfg, name)
        if value != defaults[name]:
            takers = [d.name for d in registry.DESIGNS.values() if name in d.options]
            raise ConfigError(f"{name}={value!r} is not taken by mode={cfg.mode!r}; allowed "
                              f"with mode {', '.join(takers)} (every other mode keeps the "
                              f"default, {defaults[name]!r})")


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


# -- the ranks a design's wiring needs ----------------------------------------------------------
#: options that size a role (the role, the option); only designs that take the option may
#: set it above 1
SIZING = (("learner", "learners"), ("server", "servers"), ("replay", "replay_ranks"))


def check_wiring(cfg, world_size: int) -> None:
    """The design's serving ranks (:mod:`mpirl.registry`) leave one experience rank or
    more, every learner and replay rank has one, and options that size roles are the
    design's own (after every count was checked >= 1)."""
    design = registry.design(cfg.mode)
    for role, option in SIZING:
        value = getattr(cfg, option)
        if option != "replay_ranks" and value != 1 and option not in design.options:
            owners = [d for d in MODES if option in registry.design(d).options]
            raise ConfigError(f"{option}={value} with mode={cfg.mode!r}; allowed: 1 (several "
                              f"{role}s are for mode {' or '.join(owners)})")
    serving = design.serving(cfg)
    if world_size <= len(serving):
        raise ConfigError(f"mode={cfg.mode!r} with {_spell(design, serving, cfg)} needs at "
                          f"least {len(serving) + 1} ranks (one {design.experience_role} or "
                          f"more), got {world_size}; {_fewer(design, serving, cfg)}")
    experience = design.experience_ranks(cfg, world_size)
    for role, noun in (("learner", "learner"), ("replay", "replay rank")):
        option = dict((r, o) for r, o in SIZING if o in design.options).get(role)
        count = serving.count(role)
        if option and count > experience:
            others = len(serving) - count
            raise ConfigError(f"{option}={count} with {world_size} ranks leaves {experience} "
                              f"{design.experience_role}s, and every {noun} needs one; "
                              f"allowed: 1..{max(1, (world_size - others) // 2)}")
    actors_envs = experience * cfg.num_envs
    if design.inference and cfg.inference_mode() == "fixed" and \
            cfg.inference_batch > actors_envs:
        raise ConfigError(f"inference_batch={cfg.inference_batch} with fixed-size batching "
                          f"can never fill: {experience} actors x num_envs "
                          f"{cfg.num_envs} = {actors_envs} observations at most; allowed: "
                          f"0..{actors_envs}")


def _spell(design, serving: tuple[str, ...], cfg) -> str:
    """``learners=2``, ``1 learner and replay_ranks=2``: the serving ranks, by role."""
    parts = []
    for role in dict.fromkeys(serving):
        option = dict((r, o) for r, o in SIZING if o in design.options).get(role)
        count = serving.count(role)
        parts.append(f"{option}={getattr(cfg, option)}" if option else
                     f"{count} {role}{'s' if count > 1 else ''}")
    return " and ".join(parts)


def _fewer(design, serving: tuple[str, ...], cfg) -> str:
    """What to change: lower an option that made several serving ranks, or launch more."""
    sized = [o for r, o in SIZING if o in design.options and serving.count(r) > 1]
    if sized:
        return " or ".join(f"lower --{o.replace('_', '-')}" for o in sized)
    return f"launch with mpirun -np {len(serving) + 1} or more"
