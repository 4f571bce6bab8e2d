"""The design kit: what several designs share, beside the designs that use it.

A registered design (:mod:`mpirl.designs`) imports the kit and the parts, never another
design.

* :mod:`.common`: building a rank's replica (actor-critic or DQN), the run
  :class:`~.common.Summary`, episode bookkeeping, start-up checks;
* :mod:`.pushpull`: a parameter server's worker (push a gradient, pull parameters) and
  the server's book of its workers (async, quorum, gorila, sharded async);
* :mod:`.shards`: the sharded parameter server's run (gorila, ``async --servers S``);
* :mod:`.actorlearner`: the reply records, the learner's unroll queue and V-trace step,
  the actor-learner designs' accounting (impala, seed, ga3c, apex);
* :mod:`.replayservice`: prioritized replay served over MPI (apex, gorila's service);
* :mod:`.book`: the deciding rank's book of the run and the one stop rule;
* :mod:`.ledger`: the end-of-run counts, summed over ranks and checked.
"""
