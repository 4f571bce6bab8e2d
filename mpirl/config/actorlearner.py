"""The actor-learner designs' fields: impala's learners and refresh, V-trace's clips,
seed's and ga3c's inference batching, the learner's device."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .checks import at_least, choice, doc, in_range

REFRESH = ("unroll", "updates", "episode")
DELIVERY = ("push", "broadcast")
REPLY_PROGRESS = ("auto", "thread", "calls")
INFERENCE_POLICIES = ("auto", "fixed", "drain")
DEVICES = ("cpu", "cuda")


@dataclass
class ActorLearnerFields:
    learners: int = doc("impala: learner ranks (0..L-1); they average their gradients with "
                         "the topology's allreduce; every other rank is an actor", default=1)
    unroll_batch: int = doc("unrolls per learner update (impala, seed; ga3c: the "
                             "trainer's batch); 0 = one per actor the learner serves",
                             default=0)
    param_refresh: str = doc(
        "impala: when an actor gets fresh parameters with the reply to its unroll: "
        "'unroll' (every unroll, the paper), 'updates' (once the learner is "
        "--refresh-every updates ahead of the actor's copy), 'episode' (when one of the "
        "actor's episodes ended in the unroll: fetch before the next game)", default="unroll")
    refresh_every: int = doc("impala --param-refresh updates, apex --param-delivery "
                             "broadcast: K learner updates between refreshes", default=1)
    param_delivery: str = doc(
        "impala, apex: how fresh parameters reach the actors: 'push' (each actor's reply carries "
        "its own copy: the learner's link sends actors x n bytes) or 'broadcast' (one "
        "bcast through --topology over the learner and its actors, on a thread at each "
        "end: ring = a pipelined chain, tree = a binomial tree; every --refresh-every "
        "updates, every update with impala's --param-refresh unroll; apex's actors take "
        "the newest at their --actor-refresh-steps)", default="push")
    reply_progress: str = doc(
        "apex with --param-delivery push: how the learner's parameter replies travel while "
        "it trains: 'thread' (a thread of the learner's lets MPI progress, so replies move "
        "and requests land while it computes), 'calls' (only inside the learner's own MPI "
        "calls), or 'auto': thread where a replay rank shares the learner's node (MPICH "
        "polls the network only when shared memory is idle, and a learner fed through "
        "shared memory holds its replies), calls where its batches come over the network "
        "(there the thread only slowed the learner's compute, measured)", default="auto")
    max_policy_lag: int = doc("impala/seed/ga3c: unrolls whose parameters are more than "
                               "this many updates old are dropped (counted); 0 = no bound",
                               default=0)
    rho_bar: float = doc("V-trace: clip of the importance weight in the targets; 0 = none",
                          default=1.0)
    c_bar: float = doc("V-trace: clip of the trace-cutting weights c; 0 = none", default=1.0)
    pg_rho_bar: float = doc("V-trace: clip of the weight in the policy gradient; 0 = none",
                             default=1.0)
    vtrace_lambda: float = doc("V-trace: lambda multiplying the c weights", default=1.0)
    inference_policy: str = doc(
        "seed/ga3c inference batching: 'fixed' (wait for --inference-batch observations, "
        "seed_rl), 'drain' (take what has arrived, waiting at most --inference-wait-s for "
        "more: GA3C's predictor); auto = fixed for seed, drain for ga3c", default="auto")
    inference_batch: int = doc(
        "seed/ga3c: observations per forward pass (fixed: exactly, rounded up to whole "
        "actors; drain: at most); 0 = half the actors' envs (fixed), all of them (drain)",
        default=0)
    inference_wait_s: float = doc("drain batching: longest wait for more requests once "
                                   "one has arrived", default=0.002)
    learner_device: str = doc("device of the learner and inference ranks: cpu (cuda is "
                               "checked and refused: not built yet)", default="cpu")


def check_actor_learner(cfg, world_size: int) -> None:
    choice("param_refresh", cfg.param_refresh, REFRESH)
    choice("param_delivery", cfg.param_delivery, DELIVERY)
    choice("reply_progress", cfg.reply_progress, REPLY_PROGRESS)
    if cfg.mode == "apex" and cfg.param_delivery == "push" and cfg.refresh_every != 1:
        raise ConfigError(f"refresh_every={cfg.refresh_every} times apex's broadcasts, and "
                          "this run pushes (its actors pull every --actor-refresh-steps); "
                          "allowed: --param-delivery broadcast, or refresh_every 1")
    if cfg.param_delivery == "broadcast" and cfg.reply_progress != "auto":
        raise ConfigError(f"reply_progress={cfg.reply_progress!r} moves the push's parameter "
                          "replies, and this run broadcasts them; allowed with broadcast: "
                          "reply_progress auto (the default)")
    if cfg.param_delivery == "broadcast" and cfg.param_refresh == "episode":
        raise ConfigError("param_delivery='broadcast' reaches every actor at once, and "
                          "param_refresh='episode' is one actor's; allowed with broadcast: "
                          "param_refresh unroll or updates")
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
    if cfg.learner_device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("learner_device='cuda' but torch sees no GPU on this machine; "
                              "allowed here: cpu")
        # the learner's flat parameter and gradient buffers are host memory that the
        # channels and topologies send in place; a device copy is not built yet
        raise ConfigError("learner_device='cuda' is not supported yet (the learner's flat "
                          "buffers live in host memory); allowed: cpu")
