# The two commands of the README. Each sets up .venv/ on a fresh machine first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup clean browser

# torch==2.13.0 is pinned: it is the CPU build on this machine's disk.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[torch,dev]"
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

clean:
	rm -rf $(VENV) out
