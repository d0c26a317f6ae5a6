# Two commands on a fresh machine: `make run` and `make test`. Both set up .venv first: `run` with only
# what running needs, `test` (and install, lint, bench, flower) with the dev tools on top.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# chordflow's own bytecode, written once: each command is a fresh process, and where PYTHONDONTWRITEBYTECODE=1 is set
# Python would compile every module it imports at every start (the venv's packages are compiled by pip already).
COMPILE := $(BIN)/python -m compileall -q ir scheduler worker

.PHONY: install run test test-fast lint docs bench flower worker clean fuzz chaos browser podman container-images \
	container-env test-containers

install: $(DEV_STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	$(COMPILE)
	touch $(RUN_STAMP)

$(DEV_STAMP): $(RUN_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

run: $(RUN_STAMP)
	$(BIN)/chordflow run examples/word_counts.json --input folder=examples/texts

# The suite in TEST_JOBS processes (pytest-xdist), each with its own redis-server and workers: most tests wait on
# real processes (dead-worker bounds, leases), so four share two cores well. TEST_JOBS=0 runs it in one process.
# Tests last from a second to three minutes: an idle process takes tests queued for a busy one (worksteal), so the
# suite does not end with one process working through its queue alone; the slowest tests are listed at the end.
TEST_JOBS ?= 4
test: install browser container-images
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist worksteal --durations=25

# The fast loop: only the tests that start no process (no cluster, no redis-server, no `chordflow` command, no
# browser: tests/support/kinds.py), the IR fuzz property with fewer documents. A test that starts a process
# without its marker fails here, naming it. `make test` stays the whole suite.
test-fast: install
	CHORDFLOW_TEST_FAST=1 CHORDFLOW_FUZZ_EXAMPLES=300 $(BIN)/python -m pytest -q -n $(TEST_JOBS) -m "not processes"

# The dashboard's browser test (tests/scheduler/ops/test_dashboard.py) drives Debian's chromium through chromedriver:
# installed here when missing (as root, else through sudo). `make run` never needs it.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

# The deploy files as real containers (tests/scheduler/test_containers.py): Debian's podman, runc and debootstrap,
# installed here when missing. Where no registry image can be pulled, the Dockerfile's BASE_IMAGE is built from
# Debian's packages (debootstrap, python3 3.11; it trusts the certificates this host trusts, so pip reaches PyPI
# through a TLS proxy that the host trusts) and Redis's image on top of it. This machine's podman settings
# stay in CONTAINERS_CACHE and on podman's command line (runc, cgroupfs, no default ulimits): the host's own podman
# configuration is left as it is. Images are made once and kept by podman: the base and Redis while they exist,
# chordflow's through podman's layer cache (the dependencies' layer depends on pyproject.toml alone, so a change
# to the code rebuilds only the last layer, in seconds; the first build takes a few minutes).
CONTAINERS_CACHE ?= $(HOME)/.cache/chordflow/containers
PODMAN_FLAGS ?= --runtime runc --cgroup-manager cgroupfs
PODMAN := env CONTAINERS_CONF=$(CONTAINERS_CACHE)/containers.conf podman $(PODMAN_FLAGS)
DEBIAN_MIRROR ?= http://deb.debian.org/debian
CONTAINER_BASE := localhost/chordflow-base:bookworm
CONTAINER_REDIS := localhost/chordflow-redis:bookworm
CONTAINER_IMAGE := localhost/chordflow-test:latest

podman:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || { \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap; } >&2

# Every line of podman's and debootstrap's output goes to stderr: `container-env` prints only its variables.
container-images: podman
	@mkdir -p $(CONTAINERS_CACHE)
	@printf '[containers]\ndefault_ulimits = []\n' > $(CONTAINERS_CACHE)/containers.conf
	@$(PODMAN) image exists $(CONTAINER_BASE) || { \
		echo "building $(CONTAINER_BASE) from Debian's packages (once: about a minute)" && \
		rm -rf $(CONTAINERS_CACHE)/rootfs && \
		$(SUDO) debootstrap --variant=minbase --include=python3,python3-venv bookworm $(CONTAINERS_CACHE)/rootfs \
			$(DEBIAN_MIRROR) >$(CONTAINERS_CACHE)/debootstrap.log && \
		$(SUDO) cp /etc/ssl/certs/ca-certificates.crt $(CONTAINERS_CACHE)/rootfs/etc/ssl/certs/ && \
		$(SUDO) tar -C $(CONTAINERS_CACHE)/rootfs -c . | $(PODMAN) import - $(CONTAINER_BASE) && \
		$(SUDO) rm -rf $(CONTAINERS_CACHE)/rootfs; } >&2
	@$(PODMAN) image exists $(CONTAINER_REDIS) || printf '%s\n' "FROM $(CONTAINER_BASE)" \
		"RUN apt-get update -q && apt-get install -y -q --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*" \
		| $(PODMAN) build --quiet -t $(CONTAINER_REDIS) -f - $(CONTAINERS_CACHE) >&2
	@old=$$($(PODMAN) image inspect --format '{{.Id}}' $(CONTAINER_IMAGE) 2>/dev/null); \
	$(PODMAN) build --quiet --build-arg BASE_IMAGE=$(CONTAINER_BASE) -t $(CONTAINER_IMAGE) -f deploy/Dockerfile . >&2 && \
	if [ -n "$$old" ] && [ "$$old" != "$$($(PODMAN) image inspect --format '{{.Id}}' $(CONTAINER_IMAGE))" ]; then \
		$(PODMAN) rmi "$$old" >/dev/null 2>&1 || true; fi

# What the container test reads: how to call podman here and the images' names.
container-env: container-images
	@echo "PODMAN_FLAGS=$(PODMAN_FLAGS)"
	@echo "CONTAINERS_CONF=$(CONTAINERS_CACHE)/containers.conf"
	@echo "CONTAINER_IMAGE=$(CONTAINER_IMAGE)"
	@echo "CONTAINER_REDIS=$(CONTAINER_REDIS)"

test-containers: install container-images
	$(BIN)/python -m pytest -q tests/scheduler/test_containers.py

# The IR fuzz property (tests/ir/test_ir_fuzz.py) with many more documents than `make test` runs (5,000).
FUZZ_EXAMPLES ?= 200000
fuzz: install
	CHORDFLOW_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/ir/test_ir_fuzz.py

# The fault campaign (tests/chaos/): generated workflows on a cluster of its own while faults hit it, invariants checked
# after each schedule. SEED=N replays schedule N exactly; SCHEDULES=K runs schedules 1..K. `make test` runs a few.
SCHEDULES ?= 10
chaos: install
	$(BIN)/python -m tests.chaos $(if $(SEED),--seed $(SEED),--schedules $(SCHEDULES))

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The docs site: docs/reference/ regenerated from the code (the CLI, settings, node types, IR schema, metrics, Redis
# keys), then every page built into site/ with --strict (a broken link fails). tests/test_docs.py checks both.
docs: install
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: install
	$(BIN)/python -m bench
	$(BIN)/python -m bench.fairness
	$(BIN)/python -m bench.provider_batches
	$(BIN)/python -m bench.tracing

flower: install
	$(BIN)/chordflow flower $(FLOWER_ARGS)

# Workers need the cluster's signing key: export CHORDFLOW_SECRET_KEY (or CHORDFLOW_SECRET_KEY_FILE), the same
# on every worker and client; WORKER_ARGS=--insecure runs unsigned tasks instead (a private broker only).
worker: $(RUN_STAMP)
	$(BIN)/chordflow worker $(WORKER_ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .ruff_cache
