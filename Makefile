# The two commands: `make run` (default study suite -> reports/) and `make test` (pytest).
# Both create .venv and install the project into it when missing or when pyproject.toml changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench reference clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/tokenfactory study all --out reports

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

# docs/reference.md: every key of every file a user writes, generated from the readers' metadata
reference: $(STAMP)
	$(BIN)/python -m tokenfactory.reference --write docs/reference.md

clean:
	rm -rf $(VENV) reports build *.egg-info
