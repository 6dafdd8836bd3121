#!/usr/bin/env bash
# Installs and starts what `make test` needs (with the argument `bench`,
# what `make bench` needs too), so that `make test` alone passes on a
# fresh Debian machine: MariaDB answering on 127.0.0.1:3306
# (scripts/ensure-mariadb.sh), and the tools the end-to-end tests drive.
# Debian packages are installed only when their command is absent; without
# root, a missing one is reported and the tests that need it fail under CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# command -> Debian package
declare -A pkgs=(
  [mariadb]=mariadb-client
  [mariadb-test]=mariadb-test
  [sysbench]=sysbench
  [prometheus]=prometheus
  [promtool]=prometheus
  [curl]=curl
  [node]=nodejs
  [npm]=npm
  [java]=default-jre-headless
  [script]=bsdutils
  [chromium]=chromium
)
# `test-deps.sh bench` also installs what only `make bench` drives.
if [ "${1:-}" = bench ]; then
  pkgs[haproxy]=haproxy
fi
need=()
for cmd in "${!pkgs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || need+=("${pkgs[$cmd]}")
done
# MariaDB's test plugins (auth_test_plugin: cleartext_plugin_server) come
# with mariadb-test; the TLS test loads them into its private mariadbd.
plugindir=$(ls -d /usr/lib/mysql/plugin 2>/dev/null || true)
if [ -n "$plugindir" ] && [ ! -e "$plugindir/auth_test_plugin.so" ]; then
  need+=(mariadb-test)
fi
# MariaDB Connector/J, which tests/caps_test.go and make bench-proxy drive.
[ -e /usr/share/java/mariadb-java-client.jar ] || need+=(libmariadb-java)
if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  if [ "$(id -u)" != 0 ]; then
    echo "test-deps: missing ${need[*]} and not root to install them" >&2
  else
    echo "test-deps: installing ${need[*]}"
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
# node's mysql2 driver (tests/backendclose_test.go), pinned, under .cache/node.
mysql2_version=3.24.6
if command -v npm >/dev/null 2>&1 && [ ! -e .cache/node/node_modules/mysql2/package.json ]; then
  echo "test-deps: installing mysql2@$mysql2_version under .cache/node"
  npm install --no-audit --no-fund --prefix .cache/node "mysql2@$mysql2_version" >/dev/null
fi
bash scripts/ensure-mariadb.sh
