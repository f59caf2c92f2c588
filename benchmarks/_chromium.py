"""Debian's Chromium as the report's tests, benchmark and screenshot script launch it
(through Playwright, never Playwright's own browser download).

The flags: headless as root needs ``--no-sandbox``; the rest keep Chromium off the network,
which these machines close (without them it tries Google's hosts at every start).
"""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"  # Debian's package (scripts/install-browser.sh)
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Any) -> Any:
    """``playwright.chromium.launch`` of :data:`CHROMIUM`, headless, with :data:`ARGS`."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
