# s3ckpt: two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install demo test test-terraform lint typecheck unit integration bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch, pinned (an unpinned torch pulls a multi-GB CUDA build).
	$(PIP) torch==2.13.0
	$(PIP) -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Save and load a small model on an embedded local S3 server (or S3CKPT_DEMO_URL).
demo: install
	$(PY) -m s3ckpt.demo

## Lint, type-check and run the whole test suite.
# tests/terraform (issue 6, in review) runs with `make test-terraform` until it is wired in.
test: install lint typecheck
	$(PY) -m pytest -q --ignore=tests/terraform

test-terraform: install
	$(PY) -m pytest -q tests/terraform

lint: install
	$(VENV)/bin/ruff check s3ckpt tests

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

bench: install
	$(PY) benchmarks/bench_dcp.py --size-mib 1024 --runs 3

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
