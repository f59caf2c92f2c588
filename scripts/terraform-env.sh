#!/usr/bin/env bash
# Terraform for s3ckpt's terraform/ module, on machines with or without registry access.
#
#   source scripts/terraform-env.sh        export TF_CLI_CONFIG_FILE (a CLI config that installs
#                                          hashicorp/aws from a local provider mirror, if one
#                                          exists) and CHECKPOINT_DISABLE=1
#   scripts/terraform-env.sh mirror        print the provider mirror folder (exit 1 if none)
#   scripts/terraform-env.sh check         fmt -check, init + validate (module and examples), test
#   scripts/terraform-env.sh checkov       checkov --skip-download in its own venv (.venv-checkov)
#   scripts/terraform-env.sh integration   apply/verify/destroy against moto (pytest tests/terraform)
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

# terraform init for one configuration folder, with its data dir outside the checkout.
_s3ckpt_tf_init() {
    local dir="$1" data
    data="$(s3ckpt_tf_work)/data/$(printf '%s' "${dir#"${_s3ckpt_tf_repo}"/}" | tr '/' '_')"
    mkdir -p "${data}"
    TF_DATA_DIR="${data}" terraform -chdir="${dir}" init -backend=false -input=false -no-color >/dev/null ||
        { echo "terraform init failed in ${dir}" >&2; return 1; }
    printf '%s\n' "${data}"
}

s3ckpt_tf_check() {
    command -v terraform >/dev/null || { echo "terraform not on PATH" >&2; return 1; }
    s3ckpt_tf_env
    local tf="${_s3ckpt_tf_repo}/terraform" dir data
    echo "== terraform fmt -check -recursive"
    terraform -chdir="${tf}" fmt -check -recursive -diff || return 1
    for dir in "${tf}" "${tf}"/examples/*/; do
        dir="${dir%/}"
        echo "== terraform validate ${dir#"${_s3ckpt_tf_repo}"/}"
        data="$(_s3ckpt_tf_init "${dir}")" || return 1
        TF_DATA_DIR="${data}" terraform -chdir="${dir}" validate -no-color || return 1
    done
    echo "== terraform test (mock provider)"
    data="$(_s3ckpt_tf_init "${tf}")" || return 1
    TF_DATA_DIR="${data}" terraform -chdir="${tf}" test -no-color || return 1
}

s3ckpt_tf_checkov() {
    local venv="${S3CKPT_CHECKOV_VENV:-${_s3ckpt_tf_repo}/.venv-checkov}"
    local req="${_s3ckpt_tf_repo}/requirements/checkov.txt"
    # checkov pins many libraries (boto3 among them) that conflict with the project's venv.
    if [[ ! -x "${venv}/bin/checkov" ]] || ! cmp -s "${req}" "${venv}/.s3ckpt-requirements"; then
        echo "== creating ${venv} from ${req#"${_s3ckpt_tf_repo}"/}"
        "${CHECKOV_PYTHON:-python3}" -m venv "${venv}" || return 1
        "${venv}/bin/pip" install --quiet --disable-pip-version-check -r "${req}" || return 1
        cp "${req}" "${venv}/.s3ckpt-requirements"
    fi
    echo "== checkov $("${venv}/bin/checkov" --version)"
    # --skip-download: no Bridgecrew platform calls and no external module downloads; the
    # examples' module source is local. Skips are written inline (#checkov:skip=ID: reason).
    "${venv}/bin/checkov" -d "${_s3ckpt_tf_repo}/terraform" --framework terraform \
        --skip-download --quiet --compact
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
        integration) shift; s3ckpt_tf_integration "$@" ;;
        all) s3ckpt_tf_check && s3ckpt_tf_checkov && s3ckpt_tf_integration ;;
        *)
            sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 2
            ;;
    esac
else
    s3ckpt_tf_env
fi
