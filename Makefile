# tiny-scheduler: `make` lists the targets.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTHON  ?= python3

.DEFAULT_GOAL := help
.PHONY: help install run demo test test-quick test-stress lint bench soak clean

help: ## list these targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## set up .venv/ with the scheduler and its test tools (quick when nothing changed)

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install ## start the scheduler on :9001 (set the README's variables to configure it)
	$(VENV)/bin/gunicorn -c gunicorn.conf.py

demo: install ## see it work: a dev cluster runs a handful of jobs live, then stops (<30 s)
	$(PY) -m tiny_scheduler.dev.demo

test: install ## run the tests (browser and PostgreSQL tests are skipped, with a note, without those)
	$(VENV)/bin/pytest

test-quick: install ## the decision and pure tests only: no daemon, no port (under a minute)
	$(VENV)/bin/pytest -m 'quick and not slow' -n 0 -q

test-stress: install ## the tests with two CPU-burning processes beside them (a busy machine)
	bash tests/stress.sh $(VENV)/bin/pytest

soak: install ## run the long crash-and-restart tests, which make test leaves out (minutes)
	$(VENV)/bin/pytest -m slow -n 0  # one at a time: each needs the machine's disk and memory

bench: install ## measure throughput and latency against the floor and the Go original (~23 min; BENCH_ARGS=--quick)
	$(PY) -m benchmarks $(BENCH_ARGS)

lint: install ## check style and common bugs (ruff)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean: ## remove the virtualenv, caches and local databases
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info build dist test-artifacts
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -f scheduler.db scheduler.db-wal scheduler.db-shm scheduler.db.lock
