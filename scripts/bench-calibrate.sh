#!/usr/bin/env bash
# bench-calibrate.sh — `make bench-calibrate`: CALIBRATE RESOURCE's answer
# against the RU/s that a saturating sysbench oltp_read_write run achieves
# through rgproxy (CPU-true: MariaDB on this host).
#  1. a probe (10 s, BENCH_THREADS) finds the saturated rate in TPS;
#  2. a light run at LIGHT_SHARE of it (paced with --rate) for LIGHT_TIME s;
#     CALIBRATE RESOURCE then answers live, and START_TIME ... DURATION
#     over the light run answers from the usage history: both from a load
#     that did not fill the machine;
#  3. a saturating run (BENCH_THREADS, unpaced) for SAT_TIME s: the RU/s it
#     achieved (rgproxy_ru_consumed_total of its group over the run);
#  4. the answers beside the achieved RU/s and their ratios (target within
#     20%), and CALIBRATE RESOURCE FOR GROUPS over both runs.
# On this host sysbench, rgproxy and MariaDB share the CPUs: the backend's
# capacity is what it reaches when the host is full with them beside it in
# the measured mix (docs/design.md §4.11).
# Environment: BENCH_THREADS (8), LIGHT_SHARE (0.4), LIGHT_TIME (60),
# SAT_TIME (60).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_THREADS=${BENCH_THREADS:-8}
LIGHT_SHARE=${LIGHT_SHARE:-0.4}
LIGHT_TIME=${LIGHT_TIME:-60}
SAT_TIME=${SAT_TIME:-60}
DB=sbcalib
TABLES=4
SIZE=10000

command -v sysbench >/dev/null || { echo "bench-calibrate: apt-get install sysbench" >&2; exit 1; }
[ -x bin/rgproxy ] && [ -x bin/rgserver ] || { echo "bench-calibrate: run make build" >&2; exit 1; }
[ "$LIGHT_TIME" -ge 60 ] || { echo "bench-calibrate: LIGHT_TIME must be at least 60 (CALIBRATE's shortest window)" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
sql() { mariadb -h127.0.0.1 -P"$1" -uroot -N -B -e "$2"; }
metric() { # port name label-filter
	curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" -v f="$3" '$1 ~ "^"n"({|$)" && index($1, f) { s += $2 } END { printf "%.6f\n", s }'
}

sql 3306 "CREATE DATABASE IF NOT EXISTS $DB; CREATE USER IF NOT EXISTS 'sbcal'@'%' IDENTIFIED BY 'sbcal'; GRANT ALL ON $DB.* TO 'sbcal'@'%'"
if [ "$(sql 3306 "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema='$DB' AND table_name LIKE 'sbtest%'")" -lt "$TABLES" ]; then
	sysbench oltp_read_write --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port=3306 --mysql-user=root \
		--mysql-db=$DB --tables=$TABLES --table-size=$SIZE prepare >/dev/null
fi

rgs=$(freeport); rgss=$(freeport)
bin/rgserver --addr 127.0.0.1:$rgs --status-addr 127.0.0.1:$rgss --data-dir "$tmp/rgs" --log-level warn >"$tmp/rgserver.log" 2>&1 &
pids+=($!)
waitport "$rgs"
port=$(freeport); status=$(freeport)
bin/rgproxy --listen 127.0.0.1:$port --status-addr 127.0.0.1:$status --token-server 127.0.0.1:$rgs \
	--cache-dir "$tmp/cache" --proxy-id calib --cpu-source proc --log-level warn >"$tmp/rgproxy.log" 2>&1 &
pids+=($!)
waitport "$port"
sql "$port" "DROP RESOURCE GROUP IF EXISTS bench_cal; CREATE RESOURCE GROUP bench_cal RU_PER_SEC = UNLIMITED; ALTER USER 'sbcal'@'%' RESOURCE GROUP bench_cal"
sleep 1

sb() { # threads seconds rate
	sysbench oltp_read_write --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port" --mysql-user=sbcal \
		--mysql-password=sbcal --mysql-db=$DB --tables=$TABLES --table-size=$SIZE --threads="$1" --time="$2" --rate="$3" run
}
tps() { awk '/transactions:/ { gsub(/[(]/, "", $3); print $3; exit }'; }
ru() { metric "$status" rgproxy_ru_consumed_total 'resource_group="bench_cal"'; }
utc() { date -u '+%Y-%m-%d %H:%M:%S'; }
calib() { sql "$port" "$1" | tr '\t' '|'; }

probe=$(sb "$BENCH_THREADS" 10 0 | tps)
light=$(awk -v p="$probe" -v s="$LIGHT_SHARE" 'BEGIN { printf "%d", p * s + 1 }')
echo "probe: $probe TPS saturated; light run paced at $light TPS"
sleep 11 # the probe's seconds leave the live answer's points below 20% (quiet between runs)

lstart=$(utc); r0=$(ru); t0=$(date +%s.%N)
ltps=$(sb "$BENCH_THREADS" "$LIGHT_TIME" "$light" | tps)
r1=$(ru); t1=$(date +%s.%N)
light_rus=$(awk -v a="$r0" -v b="$r1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%.0f", (b - a) / (e - s) }')
# The live answer over the last 10 minutes: the probe's seconds are
# there too, so it is asked over the light run alone as a window below;
# a fresh proxy would have only the light run.
live_light=$(calib "CALIBRATE RESOURCE")
sleep 7 # the run's last reports reach rgserver
win_light=$(calib "CALIBRATE RESOURCE START_TIME '$lstart' DURATION '${LIGHT_TIME}s'")

sstart=$(utc); r2=$(ru); t2=$(date +%s.%N)
stps=$(sb "$BENCH_THREADS" "$SAT_TIME" 0 | tps)
r3=$(ru); t3=$(date +%s.%N)
achieved=$(awk -v a="$r2" -v b="$r3" -v s="$t2" -v e="$t3" 'BEGIN { printf "%.0f", (b - a) / (e - s) }')
sleep 7
win_sat=$(calib "CALIBRATE RESOURCE START_TIME '$sstart' DURATION '${SAT_TIME}s'")
groups=$(calib "CALIBRATE RESOURCE FOR GROUPS (bench_cal) START_TIME '$lstart' END_TIME '$(utc)'")

q() { cut -d'|' -f1 <<<"$1"; }
ratio() { awk -v a="$1" -v b="$achieved" 'BEGIN { if (b > 0) printf "%.3f (%+.1f%%)", a / b, (a / b - 1) * 100; else print "n/a" }'; }
echo
echo "== bench-calibrate (sysbench oltp_read_write, $BENCH_THREADS threads, $TABLES x $SIZE rows) =="
printf "light run:      %s TPS paced at %s, %s RU/s\n" "$ltps" "$light" "$light_rus"
printf "saturating run: %s TPS, achieved %s RU/s over %s s\n" "$stps" "$achieved" "$SAT_TIME"
printf "CALIBRATE RESOURCE (live, after the light run):          QUOTA %s  ratio to achieved %s\n" "$(q "$live_light")" "$(ratio "$(q "$live_light")")"
printf "CALIBRATE RESOURCE START_TIME (the light run's window):  QUOTA %s  ratio to achieved %s\n" "$(q "$win_light")" "$(ratio "$(q "$win_light")")"
printf "CALIBRATE RESOURCE START_TIME (the saturating run):      QUOTA %s  ratio to achieved %s\n" "$(q "$win_sat")" "$(ratio "$(q "$win_sat")")"
echo "(target: within 20%)"
echo
echo "live answer:   $live_light"
echo "light window:  $win_light"
echo "sat window:    $win_sat"
echo "FOR GROUPS:"
echo "$groups"
