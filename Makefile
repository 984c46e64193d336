# tiny-scheduler: `make` lists the targets.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTHON  ?= python3

.DEFAULT_GOAL := help
.PHONY: help install run demo test lint bench soak clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## create .venv with the package and its test tools (quick when nothing changed)

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install ## run the scheduler daemon on :9001 (configure with the README's variables)
	$(VENV)/bin/gunicorn -c gunicorn.conf.py

demo: install ## see it work: a dev cluster runs a handful of jobs live, then stops (<30 s)
	$(PY) -m tiny_scheduler.dev.demo

test: install ## run the test suite
	$(VENV)/bin/pytest

soak: install ## the long crash-and-restart soak (tests marked slow; make test skips them)
	$(VENV)/bin/pytest -m slow

bench: install ## benchmark of issue 7: table + benchmarks/results/latest.json (<10 min; BENCH_ARGS=--quick)
	$(PY) -m benchmarks $(BENCH_ARGS)

lint: install ## ruff: style and common bugs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean: ## remove the virtualenv, caches and local databases
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info build dist test-artifacts
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -f scheduler.db scheduler.db-wal scheduler.db-shm
