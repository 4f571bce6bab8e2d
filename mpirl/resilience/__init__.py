"""Faults, stops and recovery, behind the few objects a design's loop calls.

* :mod:`~mpirl.resilience.guard`: ``--fail`` injection, the NaN check, the watchdog
  (:mod:`~mpirl.resilience.watchdog`) and the signal stop (:mod:`~mpirl.resilience.stop`);
* :mod:`~mpirl.resilience.exchange`: a topology whose collectives survive a rank's
  failure under ULFM (:mod:`~mpirl.resilience.ulfm`);
* :mod:`~mpirl.resilience.checkpoint`: atomic checkpoints of a rank's
  :class:`~mpirl.resilience.checkpoint.TrainingState`, generations, resume checks;
  :mod:`~mpirl.resilience.snapshot`: the parameter server's consistent snapshots;
* :mod:`~mpirl.resilience.sentinel`: names a rank that dies without a word.
"""
