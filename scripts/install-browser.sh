#!/usr/bin/env bash
# Debian's Chromium for the browser tests of `s3ckpt report` (`make browser`, a background
# phase of `make test`). The tests drive /usr/bin/chromium headless through Playwright (a
# Python package in the test extra); Playwright's own browser download needs the internet,
# Debian's package only the package registry. Installed with apt-get when missing, as root;
# anyone else is told the command. Under CI=true the browser tests fail without it; elsewhere
# they skip, saying why.
set -uo pipefail
started=${SECONDS}
if [[ -x /usr/bin/chromium ]]; then
    echo "chromium: $(/usr/bin/chromium --version 2>/dev/null) (already installed)"
    exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "no /usr/bin/chromium: install Debian's chromium package (sudo apt-get install chromium)"
    echo "for the report's browser tests; they skip without it (and fail under CI=true)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
# The package lists of a fresh machine may be empty or stale: update once, only if needed.
if ! install; then
    apt-get update -qq && install || { echo "apt-get install chromium failed"; exit 1; }
fi
echo "chromium: $(/usr/bin/chromium --version 2>/dev/null), installed in $((SECONDS - started))s"
