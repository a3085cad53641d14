# The README's commands. `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the test bed runs (Prometheus + promtool, PostgreSQL), the report tests use, and
# the bed's node and image build need (containerd, runc, CNI plugins; buildah, mmdebstrap).
# docker-registry: the registry the install-doc test pushes `make push` to (tests/chart/test_install_doc.py);
# shellcheck: actionlint checks the workflows' run: scripts with it when it is on PATH.
SYSTEM_PACKAGES := prometheus postgresql chromium containerd runc containernetworking-plugins buildah mmdebstrap docker-registry shellcheck
# The image's version: pyproject's, which the chart's appVersion (its default image tag) and the
# release tag (.github/workflows/release.yml) must equal.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml | head -n 1)
# `make image` builds IMAGE:VERSION from the one recipe (operator/Dockerfile); `make push
# REGISTRY=registry.example.com/path` retags it REGISTRY/gpu-auditor:VERSION and pushes it.
IMAGE ?= ghcr.io/gpu-auditor/gpu-auditor
# The recipe's base; point it at a mirror where Docker Hub is not reachable.
PYTHON_IMAGE ?= python:3.12-slim-bookworm
# docker when its daemon answers, else podman, else buildah (all three read the same recipe).
CONTAINER_TOOL ?= $(shell if docker info >/dev/null 2>&1; then echo docker; elif command -v podman >/dev/null 2>&1; then echo podman; else echo buildah; fi)
IMAGE_BUILD_FLAGS ?=
PUSH_FLAGS ?=
# actionlint checks .github/workflows/ in `make lint`; built once from the Go module proxy.
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := $(VENV)/tools/actionlint-$(ACTIONLINT_VERSION)/actionlint

.PHONY: install system-deps demo lint test test-fast test-kueue-newest testbed-up testbed-down clean image push

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

# The rules the tools hold (config in pyproject.toml): ruff lint and format, mypy on auditor/, import-linter
# contracts (the layers), actionlint on the GitHub workflows, and the house rules (tools/house_rules.py: size budgets,
# time from the Clock, one timestamp formatter, Kubernetes errors in one layer; shrinking lists in tools/house_rules.toml).
lint: install $(ACTIONLINT)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(ACTIONLINT)
	$(BIN)/python tools/house_rules.py

$(ACTIONLINT):
	GOBIN=$(abspath $(dir $(ACTIONLINT))) GOFLAGS=-mod=mod go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

# The image from the one recipe (docs/install.md, step 1). BuildKit reads operator/Dockerfile.dockerignore
# by itself; podman and buildah are told.
image:
	$(CONTAINER_TOOL) build -f operator/Dockerfile $(if $(filter docker,$(CONTAINER_TOOL)),,--ignorefile operator/Dockerfile.dockerignore) \
	  --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) $(IMAGE_BUILD_FLAGS) -t $(IMAGE):$(VERSION) .

# For admins who mirror images: retag what `make image` built and push it to REGISTRY.
push:
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=registry.example.com/path (pushes REGISTRY/gpu-auditor:$(VERSION))" >&2; exit 2; }
	$(CONTAINER_TOOL) tag $(IMAGE):$(VERSION) $(REGISTRY)/gpu-auditor:$(VERSION)
	$(CONTAINER_TOOL) push $(PUSH_FLAGS) $(REGISTRY)/gpu-auditor:$(VERSION)

test: install system-deps lint
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory test-kueue-newest

# Issue 29: the gate, requeue-through-the-check, demotion and doctor's Kueue tests again on the newest
# Kueue the Go module proxy serves (auditor/testbed/config.py KUEUE_NEWEST), in a bed of its own
# (a temporary state directory, no node; its Kueue built once into the cache like v0.17.0's).
KUEUE_NEWEST_TESTS := tests/testbed/test_testbed_kueue.py tests/testbed/test_kueue_versions.py tests/gate/test_gate_kueue.py tests/policy/test_ladder_requeue_via_check.py tests/policy/test_kueue_requeue.py tests/doctor/test_doctor_kueue.py
test-kueue-newest: install system-deps
	GPU_AUDITOR_TESTBED_KUEUE_VERSION=$$($(BIN)/python -c 'from auditor.testbed.config import KUEUE_NEWEST as v; print(v)') \
		$(BIN)/python -m pytest -q $(KUEUE_NEWEST_TESTS)

# Seconds, no servers: pure logic and adapter logic behind fakes of our ports (ARCHITECTURE.md, Tests).
test-fast: install
	$(BIN)/python -m pytest -m "not testbed and not slow" -q

testbed-up: install system-deps
	$(BIN)/python -m auditor.testbed up

testbed-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m auditor.testbed down; fi

clean: testbed-down
	rm -rf $(VENV) .testbed demo-out
