#!/usr/bin/env bash
# bench-metering.sh — `make bench-metering`, in one run:
#  1. sysbench oltp_point_select through rgproxy with metering on, every
#     statement charged to a limited group whose RU_PER_SEC is at least 2x
#     the demand, vs an rgproxy with --metering=false: QPS ratio (target
#     >= 0.95). On this 2-core VM the same proxy's QPS wanders +-20% from
#     one second to the next, in spells of several seconds, so the two
#     alternate in many short rounds (on/off, then off/on): each pair
#     shares the machine's mood, and the ratio of the summed QPS, the
#     median of the pairs' ratios and a 95% interval of their mean are
#     printed;
#  2. at that steady state, token-server messages per 1,000 statements
#     (target <= 1; a per-statement limiter makes 1,000);
#  3. at saturation, three proxies on one group for 30 s: RU reported to
#     rgserver vs RU_PER_SEC x T + capacity (target within +-2%).
# Environment: BENCH_TIME (s per round, default 3), BENCH_ROUNDS (30),
# BENCH_THREADS (8), SAT_TIME (30), SAT_RATE (RU/s of the saturated group, 400).
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_TIME=${BENCH_TIME:-3}
BENCH_ROUNDS=${BENCH_ROUNDS:-30}
BENCH_THREADS=${BENCH_THREADS:-8}
SAT_TIME=${SAT_TIME:-30}
SAT_RATE=${SAT_RATE:-400}
DB=sbbench
TABLES=4
SIZE=10000

command -v sysbench >/dev/null || { echo "bench-metering: apt-get install sysbench" >&2; exit 1; }
[ -x bin/rgproxy ] && [ -x bin/rgserver ] || { echo "bench-metering: run make build" >&2; exit 1; }

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

sql 3306 "CREATE DATABASE IF NOT EXISTS $DB; CREATE USER IF NOT EXISTS 'sbmeter'@'%' IDENTIFIED BY 'sbmeter'; GRANT ALL ON $DB.* TO 'sbmeter'@'%'"
if [ "$(sql 3306 "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema='$DB' AND table_name LIKE 'sbtest%'")" -lt "$TABLES" ]; then
	sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port=3306 --mysql-user=root \
		--mysql-db=$DB --tables=$TABLES --table-size=$SIZE prepare >/dev/null
fi

rgs=$(freeport); rgss=$(freeport)
bin/rgserver --addr 127.0.0.1:$rgs --status-addr 127.0.0.1:$rgss --data-dir "$tmp/rgs" --log-level warn >"$tmp/rgserver.log" 2>&1 &
pids+=($!)
waitport "$rgs"
# start_proxy sets port and status; it runs in this shell (not in $(...))
# so that cleanup knows the proxy's pid.
start_proxy() { # name extra-flags...
	local name=$1; shift
	port=$(freeport); status=$(freeport)
	bin/rgproxy --listen 127.0.0.1:$port --status-addr 127.0.0.1:$status --token-server 127.0.0.1:$rgs \
		--cache-dir "$tmp/cache-$name" --proxy-id "$name" --log-level warn "$@" >"$tmp/$name.log" 2>&1 &
	pids+=($!)
	waitport "$port"
}
start_proxy metered; mport=$port; mstatus=$status
start_proxy pure --metering=false; pport=$port; pstatus=$status

sb() { # port threads seconds user
	sysbench oltp_point_select --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$1" --mysql-user="$4" \
		--mysql-password="$4" --mysql-db=$DB --tables=$TABLES --table-size=$SIZE --threads="$2" --time="$3" run
}
qps() { awk '/queries:/ { gsub(/[(]/, "", $3); print $3; exit }'; }

# Size the limited group at >= 2x the demand: measure the demand first.
sql "$mport" "DROP RESOURCE GROUP IF EXISTS bench_meter"
probe=$(sb "$pport" "$BENCH_THREADS" 5 sbmeter | qps)
limit=$(awk -v q="$probe" 'BEGIN { printf "%d", q * 0.7 * 2 * 2 + 1000 }') # ~0.7 RU per point select, x2 headroom, x2 safety
sql "$mport" "CREATE RESOURCE GROUP bench_meter RU_PER_SEC = $limit; ALTER USER 'sbmeter'@'%' RESOURCE GROUP bench_meter"
sleep 1
echo "demand probe: $probe QPS; group bench_meter RU_PER_SEC = $limit"

declare -a on off
msgs0=$(metric "$rgss" rgserver_acquire_tokens_duration_seconds_count "")
stm0=$(metric "$mstatus" rgproxy_group_statements_total 'resource_group="bench_meter"')
for r in $(seq 1 "$BENCH_ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="on off"; else order="off on"; fi
	for o in $order; do
		if [ "$o" = on ]; then q=$(sb "$mport" "$BENCH_THREADS" "$BENCH_TIME" sbmeter | qps); on+=("$q")
		else q=$(sb "$pport" "$BENCH_THREADS" "$BENCH_TIME" sbmeter | qps); off+=("$q"); fi
	done
	echo "round $r: metering on ${on[-1]} QPS, off ${off[-1]} QPS"
done
msgs1=$(metric "$rgss" rgserver_acquire_tokens_duration_seconds_count "")
stm1=$(metric "$mstatus" rgproxy_group_statements_total 'resource_group="bench_meter"')
throttled=$(metric "$mstatus" rgproxy_throttled_total 'resource_group="bench_meter"')
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
mon=$(median "${on[@]}"); moff=$(median "${off[@]}")
ratio=$(awk -v a="${on[*]}" -v b="${off[*]}" 'BEGIN { n = split(a, x, " "); split(b, y, " "); for (i = 1; i <= n; i++) { s += x[i]; t += y[i] }; printf "%.3f", s / t }')
# Each round runs on and off back to back: the pairs' ratios are less at
# the mercy of the machine drifting between rounds.
declare -a rr
for i in "${!on[@]}"; do rr+=("$(awk -v a="${on[$i]}" -v b="${off[$i]}" 'BEGIN { printf "%.3f", a / b }')"); done
rratio=$(median "${rr[@]}")
ci=$(printf '%s\n' "${rr[@]}" | awk '{ x[NR] = $1; s += $1 } END { m = s / NR; for (i = 1; i <= NR; i++) v += (x[i] - m)^2;
	se = (NR > 1) ? sqrt(v / (NR - 1) / NR) : 0; printf "mean %.3f, 95%% interval %.3f..%.3f", m, m - 1.96 * se, m + 1.96 * se }')
per1000=$(awk -v m="$((${msgs1%.*} - ${msgs0%.*}))" -v s="$stm1" -v s0="$stm0" 'BEGIN { printf "%.3f", m / (s - s0) * 1000 }')

# Saturation accuracy: three proxies, one group at SAT_RATE, 30 s.
start_proxy sat1; a1=$port
start_proxy sat2; a2=$port
start_proxy sat3; a3=$port
sql "$a1" "DROP RESOURCE GROUP IF EXISTS bench_sat; CREATE RESOURCE GROUP bench_sat RU_PER_SEC = $SAT_RATE; ALTER USER 'sbmeter'@'%' RESOURCE GROUP bench_sat"
sleep 1
ru0=$(metric "$rgss" rgserver_ru_consumed_total 'resource_group="bench_sat"')
for p in "$a1" "$a2" "$a3"; do sb "$p" 4 "$SAT_TIME" sbmeter >"$tmp/sat-$p.out" & done
wait_sb() { while pgrep -f "oltp_point_select.*--time=$SAT_TIME" >/dev/null; do sleep 0.5; done; }
wait_sb
sleep 6 # one report period
ru1=$(metric "$rgss" rgserver_ru_consumed_total 'resource_group="bench_sat"')
acc=$(awk -v a="$ru0" -v b="$ru1" -v r="$SAT_RATE" -v t="$SAT_TIME" 'BEGIN { w = r * t + r; printf "%.1f RU vs %.0f expected (%+.2f%%)", b - a, w, (b - a - w) / w * 100 }')

echo
echo "== bench-metering =="
printf "metering on  (group at %s RU/s): median %s QPS\n" "$limit" "$mon"
printf "metering off:                   median %s QPS\n" "$moff"
printf "QPS ratio on/off (summed over %s rounds of %s s each): %s   (target >= 0.95)\n" "$BENCH_ROUNDS" "$BENCH_TIME" "$ratio"
printf "  the rounds' ratios: median %s, %s\n  (%s)\n" "$rratio" "$ci" "${rr[*]}"
printf "token-server messages per 1,000 statements: %s   (target <= 1); statements throttled: %s\n" "$per1000" "${throttled%.*}"
printf "saturation, 3 proxies, %s s at %s RU/s: %s   (target within +-2%%)\n" "$SAT_TIME" "$SAT_RATE" "$acc"
