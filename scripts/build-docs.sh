#!/usr/bin/env bash
# s3ckpt's docs site (mkdocs-material + mkdocstrings), built from docs/ with warnings as errors.
#
#   scripts/build-docs.sh venv    build .venv-docs from requirements/docs.txt, or reuse it
#                                 (interpreter and requirements unchanged)
#   scripts/build-docs.sh gen     regenerate the committed pages (CLI reference, troubleshooting)
#                                 from the parsers and the error tables, with the project venv
#   scripts/build-docs.sh check   fail when a generated page is stale, a page holds a
#                                 placeholder or links a repository file that does not exist
#   scripts/build-docs.sh build   check, then `mkdocs build --strict` into build/docs-site
#   scripts/build-docs.sh ci      venv and build, each step timed (`make docs`)
#   scripts/build-docs.sh serve   mkdocs serve (live preview on 127.0.0.1:8000)
#   scripts/build-docs.sh plots   redraw docs/img/*.png from benchmarks/results/*.json
#
# The docs venv holds only the site's tools: mkdocstrings reads s3ckpt's sources statically,
# so it needs no torch and no boto3. The generators import s3ckpt.cli and s3ckpt.errors, which
# need the package's torch-free dependencies: they run with the project venv (PYTHON, default
# <repo>/.venv/bin/python).
#
# Other knobs: S3CKPT_DOCS_VENV (default <repo>/.venv-docs), DOCS_PYTHON (the interpreter the
# docs venv is made from; default python3), S3CKPT_DOCS_SITE (default <repo>/build/docs-site).

_s3ckpt_docs_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_s3ckpt_docs_venv="${S3CKPT_DOCS_VENV:-${_s3ckpt_docs_repo}/.venv-docs}"
_s3ckpt_docs_python="${PYTHON:-${_s3ckpt_docs_repo}/.venv/bin/python}"

# "== <what>" before a step and "   ok (<seconds>s)" after it: CI time is worth watching.
_s3ckpt_docs_step_start() { _s3ckpt_docs_t0=${SECONDS}; echo "== $*"; }
_s3ckpt_docs_step_done() { echo "   ok ($((SECONDS - _s3ckpt_docs_t0))s)"; }

# The docs venv, built once and reused while requirements/docs.txt and the interpreter stay the
# same: the stamp, written last, holds both. Concurrent runs wait on a lock.
s3ckpt_docs_venv() {
    local venv="${_s3ckpt_docs_venv}" req="${_s3ckpt_docs_repo}/requirements/docs.txt"
    local python="${DOCS_PYTHON:-python3}" key lock
    key="$("${python}" -c 'import sys; print(sys.version)' | head -n 1; cat "${req}")" || return 1
    # The lock lives outside the checkout: next to the venv it would show up in `git status`.
    lock="${TMPDIR:-/tmp}/s3ckpt-docs-venv-$(id -u)-$(printf '%s' "${venv}" | cksum | cut -d' ' -f1).lock"
    (
        command -v flock >/dev/null && flock 9
        if [[ -x "${venv}/bin/mkdocs" && -f "${venv}/.s3ckpt-requirements" ]] &&
            [[ "$(cat "${venv}/.s3ckpt-requirements")" == "${key}" ]]; then
            echo "== ${venv#"${_s3ckpt_docs_repo}"/} is up to date with ${req#"${_s3ckpt_docs_repo}"/}"
            exit 0
        fi
        _s3ckpt_docs_step_start "creating ${venv#"${_s3ckpt_docs_repo}"/} from ${req#"${_s3ckpt_docs_repo}"/}"
        rm -f "${venv}/.s3ckpt-requirements"
        "${python}" -m venv --clear "${venv}" || exit 1
        "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --prefer-binary \
            --no-compile -r "${req}" || exit 1
        printf '%s\n' "${key}" >"${venv}/.s3ckpt-requirements"
        _s3ckpt_docs_step_done
    ) 9>"${lock}" || return 1
}

s3ckpt_docs_gen() {
    _s3ckpt_docs_step_start "docs/_gen/gen_pages.py (CLI reference, troubleshooting)"
    "${_s3ckpt_docs_python}" "${_s3ckpt_docs_repo}/docs/_gen/gen_pages.py" || return 1
    _s3ckpt_docs_step_done
}

s3ckpt_docs_check() {
    _s3ckpt_docs_step_start "docs/_gen/gen_pages.py --check and docs/_gen/check_docs.py"
    "${_s3ckpt_docs_python}" "${_s3ckpt_docs_repo}/docs/_gen/gen_pages.py" --check || return 1
    "${_s3ckpt_docs_python}" "${_s3ckpt_docs_repo}/docs/_gen/check_docs.py" || return 1
    _s3ckpt_docs_step_done
}

s3ckpt_docs_build() {
    local site="${S3CKPT_DOCS_SITE:-${_s3ckpt_docs_repo}/build/docs-site}"
    s3ckpt_docs_check || return 1
    _s3ckpt_docs_step_start "mkdocs build --strict (site in ${site#"${_s3ckpt_docs_repo}"/})"
    # Not --quiet: it drops warnings before --strict counts them.
    (cd "${_s3ckpt_docs_repo}" && NO_MKDOCS_2_WARNING=1 "${_s3ckpt_docs_venv}/bin/mkdocs" build --strict \
        --site-dir "${site}") || return 1
    _s3ckpt_docs_step_done
}

# What `make docs` runs.
s3ckpt_docs_ci() {
    local started=${SECONDS} t venv_s
    t=${SECONDS}
    s3ckpt_docs_venv || return 1
    venv_s=$((SECONDS - t)) t=${SECONDS}
    s3ckpt_docs_build || return 1
    echo "== docs site built ($((SECONDS - started))s: docs venv ${venv_s}s, checks and" \
        "mkdocs build $((SECONDS - t))s)"
}

s3ckpt_docs_plots() {
    s3ckpt_docs_venv || return 1
    _s3ckpt_docs_step_start "benchmarks/plot.py -> docs/img/"
    "${_s3ckpt_docs_venv}/bin/python" "${_s3ckpt_docs_repo}/benchmarks/plot.py" || return 1
    _s3ckpt_docs_step_done
}

if [[ "${BASH_SOURCE[0]}" == "${0}" ]]; then
    set -euo pipefail
    case "${1:-}" in
        venv) s3ckpt_docs_venv ;;
        gen) s3ckpt_docs_gen ;;
        check) s3ckpt_docs_check ;;
        build) s3ckpt_docs_venv && s3ckpt_docs_build ;;
        ci) s3ckpt_docs_ci ;;
        serve) s3ckpt_docs_venv && cd "${_s3ckpt_docs_repo}" && exec "${_s3ckpt_docs_venv}/bin/mkdocs" serve --strict ;;
        plots) s3ckpt_docs_plots ;;
        *)
            sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 2
            ;;
    esac
fi
