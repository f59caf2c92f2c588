#!/usr/bin/env bash
# Terraform for s3ckpt's terraform/ module, on machines with or without registry access.
#
#   source scripts/terraform-env.sh        export TF_CLI_CONFIG_FILE (a CLI config that installs
#                                          hashicorp/aws from a local provider mirror, if one
#                                          exists) and CHECKPOINT_DISABLE=1
#   scripts/terraform-env.sh mirror        print the provider mirror folder (exit 1 if none)
#   scripts/terraform-env.sh check         fmt -check, init + validate (module and examples), test
#   scripts/terraform-env.sh checkov       checkov --skip-download in its own venv (.venv-checkov)
#   scripts/terraform-env.sh checkov-venv  build .venv-checkov, or reuse it (requirements unchanged)
#   scripts/terraform-env.sh integration   apply/verify/destroy against moto (pytest tests/terraform)
#   scripts/terraform-env.sh ci            check and checkov, or a printed SKIP (exit 0) when there
#                                          is no terraform binary (`make check-terraform`)
#   scripts/terraform-env.sh all           check, checkov, integration
#
# The mirror is the folder that holds registry.terraform.io/hashicorp/aws (packed or unpacked
# layout). It is found at run time: $S3CKPT_TF_PLUGIN_MIRROR if set, else Terraform's implied
# local mirror folders, else a shallow search of a few usual roots. Nothing is hard-coded.
# Without a mirror Terraform installs from the registry as usual.
#
# Other knobs: S3CKPT_TF_WORK (scratch folder for .terraform data dirs and the CLI config;
# default ${TMPDIR:-/tmp}/s3ckpt-terraform-<uid>), S3CKPT_CHECKOV_VENV (default
# <repo>/.venv-checkov), PYTHON (interpreter for the integration test; default <repo>/.venv).

_s3ckpt_tf_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

s3ckpt_tf_find_mirror() {
    local want="registry.terraform.io/hashicorp/aws"
    if [[ -n "${S3CKPT_TF_PLUGIN_MIRROR:-}" ]]; then
        if [[ -d "${S3CKPT_TF_PLUGIN_MIRROR}/${want}" ]]; then
            printf '%s\n' "${S3CKPT_TF_PLUGIN_MIRROR%/}"
            return 0
        fi
        echo "terraform-env: S3CKPT_TF_PLUGIN_MIRROR=${S3CKPT_TF_PLUGIN_MIRROR} has no ${want}" >&2
        return 1
    fi
    local candidate root
    # Terraform's own implied mirror folders first, then shallow globs (depth <= 2) under a few
    # roots where images put shared tooling. Globbing, unlike find, never walks big trees.
    for candidate in \
        "${XDG_DATA_HOME:-${HOME:-/nonexistent}/.local/share}/terraform/plugins" \
        "${HOME:-/nonexistent}/.terraform.d/plugins" \
        /usr/local/share/terraform/plugins \
        /usr/share/terraform/plugins; do
        if [[ -d "${candidate}/${want}" ]]; then
            printf '%s\n' "${candidate}"
            return 0
        fi
    done
    for root in /opt /usr/local/share /usr/local/lib /usr/share /usr/lib /srv /var/lib "${HOME:-/nonexistent}"; do
        [[ -d "${root}" ]] || continue
        for candidate in "${root}" "${root}"/* "${root}"/*/*; do
            if [[ -d "${candidate}/${want}" ]]; then
                printf '%s\n' "${candidate}"
                return 0
            fi
        done
    done
    return 1
}

s3ckpt_tf_work() {
    printf '%s\n' "${S3CKPT_TF_WORK:-${TMPDIR:-/tmp}/s3ckpt-terraform-$(id -u)}"
}

# Write a CLI config for the mirror and export TF_CLI_CONFIG_FILE. The inherited value may name
# a file that does not exist (Terraform then warns and ignores it), so it is always replaced.
s3ckpt_tf_env() {
    export CHECKPOINT_DISABLE=1
    local mirror work config
    work="$(s3ckpt_tf_work)"
    mkdir -p "${work}"
    config="${work}/terraformrc"
    if mirror="$(s3ckpt_tf_find_mirror)"; then
        # Written to a temporary name and renamed, so concurrent runs never read half a file.
        cat >"${config}.$$" <<EOF
# Written by scripts/terraform-env.sh: install hashicorp/aws from the local mirror only.
disable_checkpoint = true
provider_installation {
  filesystem_mirror {
    path    = "${mirror}"
    include = ["registry.terraform.io/hashicorp/aws"]
  }
  direct {
    exclude = ["registry.terraform.io/hashicorp/aws"]
  }
}
EOF
        mv -f "${config}.$$" "${config}"
        export TF_CLI_CONFIG_FILE="${config}"
    else
        echo "terraform-env: no local provider mirror found; terraform will use the registry" >&2
        printf 'disable_checkpoint = true\n' >"${config}"
        export TF_CLI_CONFIG_FILE="${config}"
    fi
}

# terraform init for one configuration folder, with its data dir outside the checkout (one per
# checkout and folder). Skipped when the data dir was initialised from the same configuration:
# a stamp holds the terraform version, the CLI config and every .tf file the folder's init reads
# (its own and the module's, which the examples use from ../..).
_s3ckpt_tf_init() {
    local dir="$1" data key
    data="$(s3ckpt_tf_work)/data/$(printf '%s' "${_s3ckpt_tf_repo}" | cksum | cut -d' ' -f1)_$(
        printf '%s' "${dir#"${_s3ckpt_tf_repo}"/}" | tr '/' '_')"
    mkdir -p "${data}"
    key="$(
        terraform version 2>/dev/null | head -n 1
        cat "${TF_CLI_CONFIG_FILE:-/dev/null}" 2>/dev/null
        cd "${dir}" && sha256sum ./*.tf "${_s3ckpt_tf_repo}"/terraform/*.tf 2>/dev/null
    )"
    (
        # One init at a time per data dir: concurrent runs from the same checkout share it.
        command -v flock >/dev/null && flock 9
        if [[ -f "${data}/.s3ckpt-init" && -f "${dir}/.terraform.lock.hcl" ]] &&
            [[ "$(cat "${data}/.s3ckpt-init")" == "${key}" ]]; then
            exit 0
        fi
        rm -f "${data}/.s3ckpt-init"
        TF_DATA_DIR="${data}" terraform -chdir="${dir}" init -backend=false -input=false -no-color >/dev/null ||
            { echo "terraform init failed in ${dir}" >&2; exit 1; }
        printf '%s\n' "${key}" >"${data}/.s3ckpt-init"
    ) 9>"${data}.lock" || return 1
    printf '%s\n' "${data}"
}

# "== <what> (<seconds>s)" after a step: CI time is worth watching (each terraform command that
# loads the AWS provider's schema costs tens of CPU seconds).
_s3ckpt_tf_step_start() { _s3ckpt_tf_t0=${SECONDS}; echo "== $*"; }
_s3ckpt_tf_step_done() { echo "   ok ($((SECONDS - _s3ckpt_tf_t0))s)"; }

# Start the AWS provider once, in its debug mode, and point terraform at it with
# TF_REATTACH_PROVIDERS. Otherwise every terraform command starts the 675 MB provider afresh for
# each of its graph walks, and gives up when a start takes more than one minute, which happens
# on a busy 2-core machine ("timeout while waiting for plugin to start"). Reattaching is
# Terraform's provider-development workflow; the provider is the one `terraform init` installed.
_s3ckpt_tf_provider_start() {
    local data="$1" bin log reattach i
    bin="$(compgen -G "${data}/providers/registry.terraform.io/hashicorp/aws/*/*/terraform-provider-aws*" | sort | tail -n 1)"
    [[ -n "${bin}" ]] || { echo "terraform-env: no hashicorp/aws provider under ${data}" >&2; return 1; }
    log="$(s3ckpt_tf_work)/provider.$$"
    TF_LOG=WARN "${bin}" -debug >"${log}.out" 2>"${log}.err" </dev/null &
    _s3ckpt_tf_provider_pid=$!
    for ((i = 0; i < 1200; i++)); do
        reattach="$(sed -n "s/^[[:space:]]*TF_REATTACH_PROVIDERS='\(.*\)'\$/\1/p" "${log}.out")"
        if [[ -n "${reattach}" ]]; then
            export TF_REATTACH_PROVIDERS="${reattach}"
            return 0
        fi
        kill -0 "${_s3ckpt_tf_provider_pid}" 2>/dev/null || break
        sleep 0.5
    done
    echo "terraform-env: the AWS provider did not start in debug mode:" >&2
    tail -n 20 "${log}.out" "${log}.err" >&2
    _s3ckpt_tf_provider_stop
    return 1
}

_s3ckpt_tf_provider_stop() {
    unset TF_REATTACH_PROVIDERS
    if [[ -n "${_s3ckpt_tf_provider_pid:-}" ]]; then
        # SIGINT is the provider's own way out of debug mode.
        kill -INT "${_s3ckpt_tf_provider_pid}" 2>/dev/null && wait "${_s3ckpt_tf_provider_pid}" 2>/dev/null
        rm -f "$(s3ckpt_tf_work)/provider.$$".{out,err}
        _s3ckpt_tf_provider_pid=
    fi
    return 0
}

s3ckpt_tf_check() {
    command -v terraform >/dev/null || { echo "terraform not on PATH" >&2; return 1; }
    # A subshell, so that the provider is stopped however this ends.
    (
        s3ckpt_tf_env
        trap _s3ckpt_tf_provider_stop EXIT
        tf="${_s3ckpt_tf_repo}/terraform"
        _s3ckpt_tf_step_start "terraform fmt -check -recursive"
        terraform -chdir="${tf}" fmt -check -recursive -diff || exit 1
        _s3ckpt_tf_step_done
        _s3ckpt_tf_step_start "terraform init (module, examples) and start the provider"
        declare -A data_dirs
        for dir in "${tf}" "${tf}"/examples/*/; do
            dir="${dir%/}"
            data_dirs["${dir}"]="$(_s3ckpt_tf_init "${dir}")" || exit 1
        done
        _s3ckpt_tf_provider_start "${data_dirs["${tf}"]}" || exit 1
        _s3ckpt_tf_step_done
        for dir in "${tf}" "${tf}"/examples/*/; do
            dir="${dir%/}"
            _s3ckpt_tf_step_start "terraform validate ${dir#"${_s3ckpt_tf_repo}"/}"
            TF_DATA_DIR="${data_dirs["${dir}"]}" terraform -chdir="${dir}" validate -no-color || exit 1
            _s3ckpt_tf_step_done
        done
        # The tests plan against mocks with override_during, which Terraform 1.11 introduced.
        version="$(terraform version 2>/dev/null | sed -n '1s/^Terraform v\([0-9]*\.[0-9]*\).*/\1/p')"
        if [[ "$(printf '%s\n' "1.11" "${version}" | sort -V | head -n 1)" != "1.11" ]]; then
            echo "SKIP terraform test: needs Terraform >= 1.11 (mock override_during), found ${version:-unknown}"
            exit 0
        fi
        _s3ckpt_tf_step_start "terraform test (mock provider)"
        TF_DATA_DIR="${data_dirs["${tf}"]}" terraform -chdir="${tf}" test -no-color || exit 1
        _s3ckpt_tf_step_done
    )
}

# checkov's own venv (it pins many libraries, boto3 among them, that conflict with the
# project's venv), built once and reused while requirements/checkov.txt and the interpreter stay
# the same: the stamp, written last, holds both. Concurrent runs wait on a lock.
s3ckpt_tf_checkov_venv() {
    local venv="${S3CKPT_CHECKOV_VENV:-${_s3ckpt_tf_repo}/.venv-checkov}"
    local req="${_s3ckpt_tf_repo}/requirements/checkov.txt"
    local python="${CHECKOV_PYTHON:-python3}" key lock
    key="$("${python}" -c 'import sys; print(sys.version)' | head -n 1; cat "${req}")" || return 1
    # The lock lives in the scratch folder: next to the venv it would show up in `git status`.
    lock="$(s3ckpt_tf_work)/checkov-venv-$(printf '%s' "${venv}" | cksum | cut -d' ' -f1).lock"
    mkdir -p "$(dirname "${venv}")" "$(dirname "${lock}")"
    (
        command -v flock >/dev/null && flock 9
        if [[ -x "${venv}/bin/checkov" && -f "${venv}/.s3ckpt-requirements" ]] &&
            [[ "$(cat "${venv}/.s3ckpt-requirements")" == "${key}" ]]; then
            echo "== ${venv#"${_s3ckpt_tf_repo}"/} is up to date with ${req#"${_s3ckpt_tf_repo}"/}"
            exit 0
        fi
        _s3ckpt_tf_step_start "creating ${venv#"${_s3ckpt_tf_repo}"/} from ${req#"${_s3ckpt_tf_repo}"/}"
        rm -f "${venv}/.s3ckpt-requirements"
        "${python}" -m venv --clear "${venv}" || exit 1
        # --no-compile: checkov imports a fraction of what it installs (compiled on first import).
        "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check --prefer-binary \
            --no-compile -r "${req}" || exit 1
        printf '%s\n' "${key}" >"${venv}/.s3ckpt-requirements"
        _s3ckpt_tf_step_done
    ) 9>"${lock}" || return 1
    _s3ckpt_tf_venv_ready=1
}

s3ckpt_tf_checkov() {
    local venv="${S3CKPT_CHECKOV_VENV:-${_s3ckpt_tf_repo}/.venv-checkov}" version
    [[ -n "${_s3ckpt_tf_venv_ready:-}" ]] || s3ckpt_tf_checkov_venv || return 1
    # The version from the package metadata: `checkov --version` imports all of checkov (~6 s
    # here, minutes on a slow CI machine).
    version="$("${venv}/bin/python" -c 'import importlib.metadata as m; print(m.version("checkov"))')"
    _s3ckpt_tf_step_start "checkov ${version} --skip-download"
    # --skip-download: no Bridgecrew platform calls and no external module downloads; the
    # examples' module source is local. Skips are written inline (#checkov:skip=ID: reason);
    # any failed check fails this step.
    "${venv}/bin/checkov" -d "${_s3ckpt_tf_repo}/terraform" --framework terraform \
        --skip-download --quiet --compact || return 1
    _s3ckpt_tf_step_done
}

# What `make check-terraform` runs: everything that needs no AWS, or a clear SKIP.
s3ckpt_tf_ci() {
    if ! command -v terraform >/dev/null; then
        echo "SKIP terraform checks (fmt, validate, terraform test, checkov): no terraform binary on PATH." \
            "Install Terraform >= 1.11 to run them; tests/terraform skips for the same reason."
        return 0
    fi
    local started=${SECONDS} t venv_s check_s
    t=${SECONDS}
    s3ckpt_tf_checkov_venv || return 1
    venv_s=$((SECONDS - t)) t=${SECONDS}
    s3ckpt_tf_check || return 1
    check_s=$((SECONDS - t)) t=${SECONDS}
    s3ckpt_tf_checkov || return 1
    echo "== terraform checks passed ($((SECONDS - started))s: checkov venv ${venv_s}s," \
        "terraform ${check_s}s, checkov $((SECONDS - t))s)"
}

s3ckpt_tf_integration() {
    local python="${PYTHON:-${_s3ckpt_tf_repo}/.venv/bin/python}"
    (cd "${_s3ckpt_tf_repo}" && "${python}" -m pytest tests/terraform -q -p no:cacheprovider "$@")
}

if [[ "${BASH_SOURCE[0]}" == "${0}" ]]; then
    set -euo pipefail
    case "${1:-}" in
        mirror) s3ckpt_tf_find_mirror ;;
        env) s3ckpt_tf_env && printf 'export TF_CLI_CONFIG_FILE=%q\n' "${TF_CLI_CONFIG_FILE}" ;;
        check) s3ckpt_tf_check ;;
        checkov) s3ckpt_tf_checkov ;;
        checkov-venv) s3ckpt_tf_checkov_venv ;;
        ci) s3ckpt_tf_ci ;;
        integration) shift; s3ckpt_tf_integration "$@" ;;
        all) s3ckpt_tf_check && s3ckpt_tf_checkov && s3ckpt_tf_integration ;;
        *)
            sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 2
            ;;
    esac
else
    s3ckpt_tf_env
fi
