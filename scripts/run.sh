#!/usr/bin/env bash
# `make run`: starts the whole system on embedded defaults in the
# foreground, logs under ./run/, and stops it cleanly on Ctrl-C.
#
# It fails loudly: a port it needs that something else holds, or a process
# it started that dies (at start or later), ends it with a non-zero status,
# the reason and the last lines of that process's log; the rest is stopped.
#
# rgserver authenticates its callers here too: an admin token and a proxy
# credential (for up to 8 proxies) are made once under $RUN_DIR
# (admin.token, proxy.token, readable by you only) and given to both
# processes, unless RGSERVER_FLAGS names its own credentials
# (--admin-token-file, --proxy-token-file, --tls-ca) or --insecure.
# rgproxy gets a service account on the local MariaDB (rgproxy_svc, its
# password in $RUN_DIR/service.password; scripts/service-account.sh)
# unless RGPROXY_FLAGS gives --admin-user or another --backend.
#
# Environment:
#   RGPROXY_FLAGS, RGSERVER_FLAGS  extra flags, e.g. RGPROXY_FLAGS="--max-wait 100ms"
#                                  (--listen, --addr, --status-addr move the processes)
#   BIN_DIR  where the binaries are (default bin)
#   RUN_DIR  where logs and data go (default run)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-bin}
RUN_DIR=${RUN_DIR:-run}
# shellcheck disable=SC2206
rgserver_flags=(${RGSERVER_FLAGS:-})
# shellcheck disable=SC2206
rgproxy_flags=(${RGPROXY_FLAGS:-})

# flag_value NAME WORDS...: the value of the last --NAME/-NAME (as
# "--NAME v" or "--NAME=v") in WORDS; status 1 when there is none.
flag_value() {
  local name=$1 value="" found=1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --"$name"=* | -"$name"=*) value=${1#*=} found=0 ;;
      --"$name" | -"$name") if [ $# -gt 1 ]; then value=$2 found=0; shift; fi ;;
    esac
    shift
  done
  printf '%s' "$value"
  return $found
}

# setting NAME DEFAULT WORDS...: a setting as the binary will see it: the
# flag, else the key of the --config file among WORDS, else DEFAULT.
setting() {
  local name=$1 def=$2 v file
  shift 2
  if v=$(flag_value "$name" "$@"); then printf '%s' "$v"; return; fi
  if file=$(flag_value config "$@") && [ -r "$file" ] &&
    v=$(sed -nE "s/^[[:space:]]*$name[[:space:]]*=[[:space:]]*\"([^\"]*)\".*/\1/p" "$file" | tail -n 1) && [ -n "$v" ]; then
    printf '%s' "$v"
    return
  fi
  printf '%s' "$def"
}

# given NAME WORDS...: whether the flag or the --config file's key is set.
given() {
  local name=$1 file
  shift
  flag_value "$name" "$@" >/dev/null && return 0
  file=$(flag_value config "$@") && [ -r "$file" ] && grep -qE "^[[:space:]]*$name[[:space:]]*=" "$file"
}

# answers ADDR: whether something accepts TCP connections at host:port
# (a wildcard host is tried on loopback).
answers() {
  local host=${1%:*} port=${1##*:}
  host=${host#[}
  host=${host%]}
  case $host in "" | 0.0.0.0 | ::) host=127.0.0.1 ;; esac
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

pids=()
names=()

# stop_all: SIGTERM to every process started, and wait for them.
stop_all() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# fail MESSAGE [NAME]: says why, shows NAME's log tail, stops everything
# and exits 1.
fail() {
  trap - INT TERM
  echo "make run: $1" >&2
  if [ -n "${2:-}" ] && [ -s "$RUN_DIR/$2.log" ]; then
    echo "last lines of $RUN_DIR/$2.log:" >&2
    tail -n 20 "$RUN_DIR/$2.log" | sed 's/^/  | /' >&2
  fi
  stop_all
  exit 1
}

# need_free WHAT ADDR FLAG VAR: fails when something already answers at
# ADDR, naming what holds it and how to move WHAT (FLAG in VAR).
need_free() {
  if answers "$2"; then
    local who=""
    if command -v ss >/dev/null 2>&1; then
      who=$(ss -Hltnp "sport = :${2##*:}" 2>/dev/null |
        sed -nE 's/.*users:\(\("([^"]*)",pid=([0-9]+).*/\1, pid \2/p' | head -n 1 || true)
    fi
    fail "$1 $2 is already in use${who:+ (by $who)}; stop that, or move it: $4=\"$3 <host:port>\""
  fi
}

# log_value NAME LINE KEY: KEY's value in the last line of NAME's log
# holding LINE (slog text or JSON).
log_value() {
  grep "$2" "$RUN_DIR/$1.log" | tail -n 1 | grep -oE "(\"$3\":\"|\\b$3=)[^\" ]+" | head -n 1 | sed -E "s/^(\"$3\":\"|$3=)//"
}

# wait_up NAME LINE ADDR SECONDS: waits until process NAME (the last one
# started) logs LINE, or ADDR answers while it runs (a log level above info
# hides LINE); fails when it dies or after SECONDS.
wait_up() {
  local name=$1 line=$2 addr=$3 i
  for ((i = 0; i < $4 * 5; i++)); do
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      wait "${pids[-1]}" && st=0 || st=$?
      fail "$name exited with status $st while starting" "$name"
    fi
    if grep -q "$line" "$RUN_DIR/$name.log" 2>/dev/null || answers "$addr"; then
      return 0
    fi
    sleep 0.2
  done
  fail "$name is not serving at $addr after $4 s" "$name"
}

rgs_addr=$(setting addr 127.0.0.1:3379 "${rgserver_flags[@]}")
rgs_status=$(setting status-addr 127.0.0.1:3380 "${rgserver_flags[@]}")
px_listen=$(setting listen 127.0.0.1:4000 "${rgproxy_flags[@]}")
px_status=$(setting status-addr 127.0.0.1:10080 "${rgproxy_flags[@]}")
px_console=$(setting console-addr 127.0.0.1:10081 "${rgproxy_flags[@]}")
px_backend=$(setting backend 127.0.0.1:3306 "${rgproxy_flags[@]}")

# Every port first: nothing is started when one is taken.
need_free "rgserver's gRPC address" "$rgs_addr" --addr RGSERVER_FLAGS
need_free "rgserver's status address" "$rgs_status" --status-addr RGSERVER_FLAGS
need_free "rgproxy's MySQL address" "$px_listen" --listen RGPROXY_FLAGS
need_free "rgproxy's status address" "$px_status" --status-addr RGPROXY_FLAGS
[ -z "$px_console" ] || need_free "rgproxy's console address" "$px_console" --console-addr RGPROXY_FLAGS

bash scripts/ensure-mariadb.sh
mkdir -p "$RUN_DIR"

# rgproxy's service account (--admin-user), which QUERY_LIMIT ... ACTION =
# KILL and the binary-log write source need: made on the local MariaDB, as
# root (which ensure-mariadb.sh opens to TCP), with its password in
# $RUN_DIR/service.password; unless RGPROXY_FLAGS names an account of its
# own or another backend.
svc=()
if ! given admin-user "${rgproxy_flags[@]}"; then
  case $px_backend in
    127.0.0.1:3306 | localhost:3306)
      bash scripts/service-account.sh rgproxy_svc "$RUN_DIR/service.password"
      svc=(--admin-user rgproxy_svc --admin-password-file "$RUN_DIR/service.password")
      ;;
  esac
fi

# new_token FILE [NAME STREAMS]: a random token in FILE (mode 600), as
# "NAME token STREAMS" when given, unless FILE holds one already.
new_token() {
  [ -s "$1" ] && return
  local tok
  tok=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  (umask 077 && echo "${2:+$2 }$tok${3:+ $3}" >"$1")
}
rgs_auth=()
if ! given admin-token-file "${rgserver_flags[@]}" && ! given proxy-token-file "${rgserver_flags[@]}" &&
  ! given tls-ca "${rgserver_flags[@]}" && ! given insecure "${rgserver_flags[@]}"; then
  new_token "$RUN_DIR/admin.token"
  new_token "$RUN_DIR/proxy.token" rgproxy 8 # a line of rgserver's --proxy-token-file: 8 proxies may share it
  rgs_auth=(--admin-token-file "$RUN_DIR/admin.token" --proxy-token-file "$RUN_DIR/proxy.token")
fi

stop() {
  trap - INT TERM
  echo
  echo "stopping..."
  stop_all
  echo "stopped; logs are in $RUN_DIR/"
  exit 0
}
trap stop INT TERM

# spawn NAME ARGS...: starts binary NAME in the background, logging to
# $RUN_DIR/NAME.log.
spawn() {
  local name=$1
  shift
  "$BIN_DIR/$name" "$@" >"$RUN_DIR/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}

# in_use NAME LINE KEY FALLBACK: the address NAME logged under KEY in its
# start-up LINE, else FALLBACK (a log level above info hides the line).
in_use() {
  local v
  v=$(log_value "$1" "$2" "$3" || true)
  printf '%s' "${v:-$4}"
}

spawn rgserver --data-dir "$RUN_DIR/rgserver-data" "${rgs_auth[@]}" "${rgserver_flags[@]}"
wait_up rgserver "rgserver started" "$rgs_addr" 30
rgs_addr=$(in_use rgserver "rgserver started" addr "$rgs_addr")
rgs_status=$(in_use rgserver "rgserver started" status_addr "$rgs_status")

defaults=()
if ! given token-server "${rgproxy_flags[@]}"; then
  # A wildcard listen address is dialled on loopback.
  case ${rgs_addr%:*} in "" | 0.0.0.0 | "[::]") defaults+=(--token-server "127.0.0.1:${rgs_addr##*:}") ;; *) defaults+=(--token-server "$rgs_addr") ;; esac
  if [ ${#rgs_auth[@]} -gt 0 ]; then
    given token-server-token-file "${rgproxy_flags[@]}" || defaults+=(--token-server-token-file "$RUN_DIR/admin.token")
    given token-server-proxy-token-file "${rgproxy_flags[@]}" || defaults+=(--token-server-proxy-token-file "$RUN_DIR/proxy.token")
  fi
fi
given cache-dir "${rgproxy_flags[@]}" || defaults+=(--cache-dir "$RUN_DIR/rgproxy-cache")
spawn rgproxy "${defaults[@]}" "${svc[@]}" "${rgproxy_flags[@]}"
# rgproxy waits up to 10 s for rgserver at start.
wait_up rgproxy "rgproxy serving" "$px_listen" 30
px_listen=$(in_use rgproxy "rgproxy serving" listen "$px_listen")
px_status=$(in_use rgproxy "rgproxy serving" status "$px_status")
px_console=$(in_use rgproxy "rgproxy serving" console "${px_console:-$px_status}")

echo "rgserver: $rgs_addr (status http://$rgs_status), log $RUN_DIR/rgserver.log"
echo "rgproxy:  $px_listen -> $px_backend (status http://$px_status), log $RUN_DIR/rgproxy.log"
echo "console:  http://$px_console/ (rgproxy), http://$rgs_status/ (rgserver)"
if [ ${#svc[@]} -gt 0 ]; then
  echo "rgproxy's service account: rgproxy_svc (password in $RUN_DIR/service.password): KILL rules are enforced"
  if [ "$(mariadb -h127.0.0.1 -P3306 -uroot -N -e 'SELECT CONCAT(@@log_bin, @@binlog_format)' 2>/dev/null)" != 1ROW ]; then
    echo "  the MariaDB on 3306 writes no row-based binary log: written bytes are estimated (docs/operating.md, \"rgproxy's service account\")"
  fi
fi
echo
echo "connect with:  mariadb -h${px_listen%:*} -P${px_listen##*:} -uroot --comments"
echo "Ctrl-C stops everything."

# Until Ctrl-C: a process that dies ends the whole run, loudly.
while :; do
  wait -n "${pids[@]}" && st=0 || st=$?
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      fail "${names[$i]} exited (status $st); stopping the rest" "${names[$i]}"
    fi
  done
done
