"""Tools that study the exchanges rather than train: the microbenchmark (``bench``),
the soak test (``soak``), the alpha-beta-gamma cost model (``costmodel``), the scale
simulator (``simulate``), sweeps and their Slurm scripts (``sweep``), and MPICH's
run-time algorithm control (``mpich``).  Each runs as ``python -m mpirl.<tool>``."""
