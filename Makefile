# The two commands of the README. Each sets up .venv/ on a fresh machine first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-interop setup clean browser

# torch==2.13.0 is pinned: it is the CPU build on this machine's disk.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[torch,dev,fp8]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/trainplan demo

# The browser test needs Debian's chromium; install it where apt can (root), else it skips.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1; } || \
	  echo "chromium not installed: the browser test will be skipped"

test: $(STAMP) browser
	$(BIN)/python -m pytest

# The consumers of the exports (DeepSpeed, transformers, accelerate, torchtitan) in a venv of
# their own: a few minutes of installs that `make test` does not pay (see the README).
IVENV := .venv-interop
$(IVENV)/.installed: pyproject.toml
	test -x $(IVENV)/bin/python || $(PY) -m venv $(IVENV)
	$(IVENV)/bin/pip install -q "torch==2.13.0"
	$(IVENV)/bin/pip install -q -e ".[torch,dev,interop]"
	touch $(IVENV)/.installed

# torchtitan 0.2.x (the TOML job config) cannot share a venv with 0.3: a second one.
TVENV := .venv-interop-tt02
$(TVENV)/.installed: pyproject.toml
	test -x $(TVENV)/bin/python || $(PY) -m venv $(TVENV)
	$(TVENV)/bin/pip install -q "torch==2.13.0"
	$(TVENV)/bin/pip install -q -e ".[torch,dev]" "torchtitan==0.2.2" "triton==3.9.0"
	touch $(TVENV)/.installed

# Both suites run whatever the first gives; the target fails if either fails, naming which.
test-interop: $(IVENV)/.installed $(TVENV)/.installed
	@failed=""; \
	TRAINPLAN_INTEROP=1 $(IVENV)/bin/python -m pytest tests/plan/consumers || failed="$$failed tests/plan/consumers"; \
	TRAINPLAN_INTEROP=tt02 $(TVENV)/bin/python -m pytest tests/plan/consumers_tt02 || failed="$$failed tests/plan/consumers_tt02"; \
	if [ -n "$$failed" ]; then echo "test-interop failed:$$failed"; exit 1; fi; \
	echo "test-interop: both suites passed (torchtitan 0.3 with DeepSpeed/transformers/accelerate, torchtitan 0.2.2)"

clean:
	rm -rf $(VENV) $(IVENV) $(TVENV) out
