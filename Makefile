# The two commands of the README. Each sets up .venv/ on a fresh machine first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup clean

# torch==2.13.0 is pinned: it is the CPU build on this machine's disk.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[torch,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/trainplan demo

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) out
