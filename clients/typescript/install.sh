#!/usr/bin/env bash
# clients/typescript/install.sh: install the package's pinned dependencies
# (package-lock.json) with `npm ci`, unless node_modules already holds
# exactly them. npm's cache (~/.npm, or $npm_config_cache) makes a cold
# install on a machine that installed them before an offline copy.
set -euo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.planex-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1) $(node --version)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
npm ci --prefer-offline --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
