"""The five parts every distributed RL architecture is wired from (the source texts'
decomposition): none of them knows how ranks are wired; :mod:`mpirl.designs` places
them on ranks and decides what travels between them.

====================  ===========================================================
part                  here
====================  ===========================================================
environment           :mod:`mpirl.parts.envs`: vectors of gymnasium envs; L2Run-v0,
                      Delay-v0
actor                 :mod:`mpirl.parts.actor`: steps envs with the policy it is
                      handed (its replica's, or answers from another rank)
learner               :mod:`mpirl.parts.learner`: model, flat buffers, losses, Adam;
                      :mod:`~mpirl.parts.learner.dqn`: n-step double DQN
replay buffer         :mod:`mpirl.parts.replay`: a FIFO; proportional prioritized
                      replay over a sum-tree (Ape-X); the transition records
                      (:mod:`mpirl.parts.transitions`)
parameter server      :mod:`mpirl.parts.server`: what a server does with a push;
                      a parameter shard's optimizer (Gorila)
====================  ===========================================================
"""
