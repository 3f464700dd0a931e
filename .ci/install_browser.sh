#!/usr/bin/env bash
# Install Debian's Chromium and ChromeDriver for the browser tests
# (tests/browser.py, tests/test_browser_harness.py).
#
# Idempotent: when /usr/bin/chromium and /usr/bin/chromedriver already run,
# it prints their versions and exits without touching apt.
# Needs root (CI and developer machines run as root) and the Debian mirror;
# it never downloads a browser build of its own (e.g. `playwright install`),
# which cannot work without internet.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
    && chromium --version >/dev/null 2>&1; then
    echo "install_browser: already installed: $(chromium --version); $(chromedriver --version | head -n1)"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install_browser: must run as root to apt-get install chromium" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
start=$(date +%s)
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "install_browser: installed $(chromium --version); $(chromedriver --version | head -n1) in $(( $(date +%s) - start ))s"
