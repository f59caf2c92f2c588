# s3ckpt: two commands do all set-up on a fresh machine: `make demo` and `make test`.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# --no-compile: byte-compiling the ~10k modules of torch and friends at install costs more than
# compiling, on first import, the few hundred a run imports. --prefer-binary: a wheel over a
# newer sdist, never a build.
PIP    := $(PY) -m pip install -q --disable-pip-version-check --prefer-binary --no-compile
# pytest-xdist workers for `make test` (0: no xdist, everything in one process).
PYTEST_WORKERS ?= 2
# --dist loadscope: a module's tests stay on one worker, so module-scoped fixtures (the terraform
# deployment, checkpoints saved once per module) are built once; tests/conftest.py puts the
# slowest module first and --no-loadscope-reorder keeps that order.
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder)

.PHONY: install browser npm-stores demo test test-terraform check-terraform check-wheel check-deploy docs lint typecheck unit integration bench clean

# torch is pinned to 2.13.0 (the test extra and constraints.txt). From PyPI alone that is, on
# Linux x86_64, the CUDA build (several GB with its nvidia-* wheels). For the CPU build, name
# the CPU wheel index: `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` (pip then
# takes 2.13.0+cpu, which the ==2.13.0 pin matches). This repository's machines have a local
# torch 2.13.0+cpu wheel in pip's find-links, so they install the CPU build as they are.
TORCH_INDEX ?=

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# One resolve for everything.
	$(PIP) -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Save and load a small model on an embedded local S3 server (or S3CKPT_DEMO_URL).
demo: install
	$(PY) -m s3ckpt.demo

# `make test`, phase by phase. The terraform checks and checkov (make check-terraform: no project
# venv needed) run in the background from the start, the docs site and the deploy/ lint once the
# project venv is installed, while install, lint, typecheck, check-wheel and pytest run in the
# foreground; each background phase's log is shown once it is done. Every phase prints its wall time and
# a summary closes the run: CI machines run this 10-25x slower than a quiet host, and the log
# says where the time went. A failed phase fails the run; the foreground stops at the first.
define TEST_SCRIPT
set -uo pipefail
started=$$SECONDS
tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/s3ckpt-test.XXXXXX")
times=$$tmp/times
phase() {
    local name=$$1 t0=$$SECONDS rc=0
    shift
    echo "==> $$name: $$*"
    "$$@" || rc=$$?
    local took=$$((SECONDS - t0)) what=ok
    ((rc == 0)) || what="FAILED (exit $$rc)"
    echo "<== $$name: $$what, $${took}s"
    printf '  %-34s %6ss  %s\n' "$$name" "$$took" "$$what" >>"$$times"
    return $$rc
}
# Background phases: each runs one make target into its own log, shown once it is done.
bg_names=() bg_pids=() bg_shown=()
bg_start() {
    local i=$${#bg_names[@]}
    ( phase "$$1 (background)" $(MAKE) --no-print-directory "$$1" >"$$tmp/bg$$i.log" 2>&1
      echo $$? >"$$tmp/bg$$i.rc" ) &
    bg_names+=("$$1") bg_pids+=($$!) bg_shown+=("")
}
bg_wait() {  # wait for the background phase named $$1 to finish
    local i
    for i in "$${!bg_names[@]}"; do
        [[ "$${bg_names[$$i]}" == "$$1" ]] || continue
        while [[ ! -f "$$tmp/bg$$i.rc" ]] && kill -0 "$${bg_pids[$$i]}" 2>/dev/null; do sleep 1; done
        [[ -f "$$tmp/bg$$i.rc" ]] || echo 1 >"$$tmp/bg$$i.rc"
    done
    bg_status
}
bg_status() {  # show the background phases that finished; fail if one of them failed
    local i rc=0
    for i in "$${!bg_names[@]}"; do
        [[ -z "$${bg_shown[$$i]}" && -f "$$tmp/bg$$i.rc" ]] || continue
        wait "$${bg_pids[$$i]}"
        bg_shown[$$i]=1
        echo "==> $${bg_names[$$i]} (background) finished; its log:"
        sed 's/^/  | /' "$$tmp/bg$$i.log"
        [[ "$$(cat "$$tmp/bg$$i.rc")" == 0 ]] || rc=1
    done
    return $$rc
}
bg_start check-terraform          # needs no project venv
bg_start browser                  # Debian's Chromium for the report's browser tests
bg_start npm-stores               # Azurite and s3rver for the azurite/s3rver tiers
rc=0
for step in install lint typecheck check-wheel pytest; do
    if [[ "$$step" == pytest ]]; then
        bg_wait browser || { rc=1; break; }
        bg_wait npm-stores || { rc=1; break; }
        phase pytest $(PY) -m pytest -q -m "not packaging" $(PYTEST_XDIST) --durations=25 || rc=1
    else
        phase "$$step" $(MAKE) --no-print-directory "$$step" || rc=1
    fi
    # The docs site and the deploy/ lint read the project venv: they start once it exists.
    [[ "$$step" == install && $$rc == 0 ]] && { bg_start docs; bg_start check-deploy; }
    bg_status || rc=1
    ((rc == 0)) || break
done
for i in "$${!bg_names[@]}"; do
    [[ -z "$${bg_shown[$$i]}" ]] || continue
    echo "==> waiting for $${bg_names[$$i]} (background)"
    while [[ ! -f "$$tmp/bg$$i.rc" ]] && kill -0 "$${bg_pids[$$i]}" 2>/dev/null; do sleep 1; done
    [[ -f "$$tmp/bg$$i.rc" ]] || echo 1 >"$$tmp/bg$$i.rc"
done
bg_status || rc=1
echo "== make test: wall time per phase (background phases overlap the others)"
cat "$$times"
printf '  %-34s %6ss  %s\n' total "$$((SECONDS - started))" "$$( ((rc == 0)) && echo ok || echo FAILED)"
rm -rf "$$tmp"
exit $$rc
endef
export TEST_SCRIPT

## Lint, type-check, check the terraform module and run the whole test suite (-n: pytest-xdist).
## --durations: CI machines run this suite 10-25x slower than a quiet host; the log says where.
test:
	@bash -c "$$TEST_SCRIPT"

## Debian's Chromium (/usr/bin/chromium), which tests/integration/test_report_s3.py drives
## headless through Playwright: installed with apt-get when missing (as root; else it says how).
browser:
	bash scripts/install-browser.sh

## Azurite 3.35.0 and s3rver 3.7.1 from npm into build/npm-stores (tests/_npm.py; ~20 s, and
## each server answers in about a second): the `azurite` and `s3rver` test tiers.
## The versions are tests/_npm.py's PACKAGES. Node.js and npm come from Debian where missing,
## as root (apt-get waits for the lock `make browser` may hold, a phase beside it in `make
## test`, and tries again); anyone else is told the command, and the tiers then skip (fail
## under CI=true).
APT_WAIT := -o DPkg::Lock::Timeout=600
npm-stores:
	@if ! command -v npm >/dev/null; then \
	    if [[ "$$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then \
	        echo "no npm: install Node.js and npm (sudo apt-get install nodejs npm) for the azurite/s3rver tiers"; \
	        exit 0; \
	    fi; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    get() { apt-get $(APT_WAIT) install -y -qq --no-install-recommends nodejs npm >/dev/null; }; \
	    for try in 1 2 3 4 5; do \
	        get || { apt-get $(APT_WAIT) update -qq && get; } && break; \
	        ((try < 5)) || { echo "apt-get install nodejs npm failed"; exit 1; }; \
	        sleep 15; \
	    done; \
	fi; \
	echo "node $$(node --version), npm $$(npm --version)"; \
	npm install --prefix build/npm-stores --no-audit --no-fund azurite@3.35.0 s3rver@3.7.1

## terraform/: fmt -check, validate, terraform test (mock provider) and checkov (in .venv-checkov,
## from requirements/checkov.txt). Prints SKIP and succeeds where there is no terraform binary.
check-terraform:
	bash scripts/terraform-env.sh ci

## The terraform checks plus tests/terraform (apply to moto, probe the roles, destroy).
test-terraform: install check-terraform
	$(PY) -m pytest -q tests/terraform

## Build the sdist and, from it, the wheel; check what they hold; install the wheel into a fresh
## venv without torch and run `s3ckpt ls / prune --policy pretraining / gc` on a moto server;
## run every code block of README.md and docs/ against the wheel (tests/packaging/test_docs.py).
check-wheel: install
	$(PY) -m pytest -q -p no:xdist -m packaging tests/packaging

## The docs site: generated pages current, no placeholders or missing files, mkdocs build --strict
## (in .venv-docs, from requirements/docs.txt).
docs: install
	bash scripts/build-docs.sh ci

## deploy/ (the retention cron's image, Kubernetes CronJob, ECS schedule): linted, see the script.
check-deploy: install
	bash scripts/check-deploy.sh

lint: install
	$(VENV)/bin/ruff check s3ckpt tests benchmarks examples

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

bench: install
	$(PY) benchmarks/bench_dcp.py --size-mib 1024 --runs 3

clean:
	rm -rf $(VENV) .venv-checkov .venv-docs build/docs-site .pytest_cache .mypy_cache .ruff_cache .hypothesis
