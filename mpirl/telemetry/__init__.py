"""What a run records: the HDF5 log (schema, writer, reader), progress lines, timers.

:mod:`~mpirl.telemetry.schema` is the one definition of every table, shared by the
writer (:mod:`~mpirl.telemetry.h5log`, :mod:`~mpirl.telemetry.runlog`) and the readers
(:mod:`~mpirl.telemetry.read`, and through it ``analysis``), which open files through
:mod:`~mpirl.telemetry.access` (pandas-free: a rank resuming its log reads it there).
"""
