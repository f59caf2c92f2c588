# s3ckpt: two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install demo test test-terraform check-terraform lint typecheck unit integration bench clean

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

## Lint, type-check, check the terraform module and run the whole test suite.
## --durations: CI machines run this suite 10-25x slower than a quiet host; the log says where.
test: install lint typecheck check-terraform
	$(PY) -m pytest -q --durations=25

## terraform/: fmt -check, validate, terraform test (mock provider) and checkov (in .venv-checkov,
## from requirements/checkov.txt). Prints SKIP and succeeds where there is no terraform binary.
check-terraform:
	bash scripts/terraform-env.sh ci

## The terraform checks plus tests/terraform (apply to moto, probe the roles, destroy).
test-terraform: install check-terraform
	$(PY) -m pytest -q tests/terraform

lint: install
	$(VENV)/bin/ruff check s3ckpt tests benchmarks

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
