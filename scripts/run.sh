#!/usr/bin/env bash
# `make run`: starts the whole system on embedded defaults in the
# foreground, logs under ./run/, and stops it cleanly on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-mariadb.sh
mkdir -p run
pids=()
stop() {
  trap - INT TERM
  echo
  echo "stopping..."
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait
  echo "stopped; logs are in ./run/"
  exit 0
}
trap stop INT TERM

# RGPROXY_FLAGS / RGSERVER_FLAGS pass extra flags, e.g. RGPROXY_FLAGS="--max-wait 100ms".
# shellcheck disable=SC2086
bin/rgserver --data-dir run/rgserver-data ${RGSERVER_FLAGS:-} >run/rgserver.log 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  (exec 3<>/dev/tcp/127.0.0.1/3379) 2>/dev/null && break
  sleep 0.2
done
echo "rgserver: 127.0.0.1:3379 (status http://127.0.0.1:3380), log run/rgserver.log"
# shellcheck disable=SC2086
bin/rgproxy --token-server 127.0.0.1:3379 --cache-dir run/rgproxy-cache ${RGPROXY_FLAGS:-} >run/rgproxy.log 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do
  if (exec 3<>/dev/tcp/127.0.0.1/4000) 2>/dev/null; then break; fi
  sleep 0.2
done
echo "rgproxy:  127.0.0.1:4000 -> 127.0.0.1:3306 (status http://127.0.0.1:10080), log run/rgproxy.log"
echo
echo "connect with:  mariadb -h127.0.0.1 -P4000 -uroot"
echo "Ctrl-C stops everything."
wait
