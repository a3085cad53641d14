# The README's commands. `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the test bed runs (Prometheus + promtool, PostgreSQL), the report tests use, and
# the bed's node and image build need (containerd, runc, CNI plugins; buildah, mmdebstrap).
SYSTEM_PACKAGES := prometheus postgresql chromium containerd runc containernetworking-plugins buildah mmdebstrap

.PHONY: install system-deps demo lint test test-fast testbed-up testbed-down clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,agent]'
	touch $@

# Installs only what is missing; needs root (CI and these machines are root).
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

demo: install
	$(BIN)/gpu-auditor demo

# The rules the tools hold (config in pyproject.toml): ruff lint and format, mypy on auditor/, import-linter contracts (the layers).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: install system-deps lint
	$(BIN)/python -m pytest

# Seconds, no servers: pure logic and adapter logic behind fakes of our ports (ARCHITECTURE.md, Tests).
test-fast: install
	$(BIN)/python -m pytest -m "not testbed and not slow" -q

testbed-up: install system-deps
	$(BIN)/python -m auditor.testbed up

testbed-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m auditor.testbed down; fi

clean: testbed-down
	rm -rf $(VENV) .testbed demo-out
