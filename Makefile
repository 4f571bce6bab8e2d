# The two commands of the README: `make run` (the main job) and `make test` (the suite).
# Both create the virtual environment and install the project into it when needed.

PYTHON ?= python3
VENV   ?= .venv
NP     ?= 4
ARGS   ?=
SWEEP  ?= experiments/topologies.yaml
FIGS   ?= figures
RUNS   ?= runs/sweeps/topologies
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mpirl-installed

.PHONY: install run test bench soak sweep plot clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,osim]'
	touch $@

run: install
	$(BIN)/mpirun -np $(NP) $(BIN)/python -m mpirl.run $(ARGS)

test: install
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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
