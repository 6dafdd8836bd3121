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
#  With BENCH_BASE=<git revision>, step 1 also builds that revision's
#  rgserver and rgproxy and runs its metered and unmetered proxies in the
#  same rotation (four proxies, the order turning every round), so that a
#  change's cost is the two ratios side by side in one run rather than
#  two runs on different days: CPU per statement of each proxy (from
#  /proc, the machine's load counts less) and each revision's ratio.
# Environment: BENCH_TIME (s per round, default 3), BENCH_ROUNDS (30),
# BENCH_THREADS (8), SAT_TIME (30), SAT_RATE (RU/s of the saturated group,
# 400), BENCH_BASE (a git revision to compare with; none by default).
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

BENCH_BASE=${BENCH_BASE:-}

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -z "$BENCH_BASE" ] || git worktree remove --force "$tmp/base" 2>/dev/null || true
	rm -rf "$tmp"
}
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

if [ -n "$BENCH_BASE" ]; then
	git worktree add --detach "$tmp/base" "$BENCH_BASE" >/dev/null
	(cd "$tmp/base" && go build -o bin/ ./cmd/rgserver ./cmd/rgproxy)
fi
# start_rgserver sets rgs and rgss (bin dir as $1); start_proxy sets port,
# status and pid (rgserver port, bin dir, name, extra flags). Both run in
# this shell (not in $(...)) so that cleanup knows the pids.
start_rgserver() {
	rgs=$(freeport); rgss=$(freeport)
	"$1/rgserver" --addr 127.0.0.1:$rgs --status-addr 127.0.0.1:$rgss --data-dir "$tmp/rgs-$rgs" --log-level warn >"$tmp/rgserver-$rgs.log" 2>&1 &
	pids+=($!)
	waitport "$rgs"
}
start_proxy_on() { # rgserver-port bin-dir name extra-flags...
	local srv=$1 dir=$2 name=$3; shift 3
	port=$(freeport); status=$(freeport)
	"$dir/rgproxy" --listen 127.0.0.1:$port --status-addr 127.0.0.1:$status --token-server 127.0.0.1:$srv \
		--cache-dir "$tmp/cache-$name" --proxy-id "$name" --log-level warn "$@" >"$tmp/$name.log" 2>&1 &
	pid=$!
	pids+=($pid)
	waitport "$port"
}
start_rgserver bin
start_proxy() { start_proxy_on "$rgs" bin "$@"; } # name extra-flags...
start_proxy metered; mport=$port; mstatus=$status; mpid=$pid
start_proxy pure --metering=false; pport=$port; ppid=$pid
if [ -n "$BENCH_BASE" ]; then
	head_rgs=$rgs head_rgss=$rgss
	start_rgserver "$tmp/base/bin"
	base_rgs=$rgs
	start_proxy_on "$base_rgs" "$tmp/base/bin" base-metered; bmport=$port; bmpid=$pid
	start_proxy_on "$base_rgs" "$tmp/base/bin" base-pure --metering=false; bpport=$port; bppid=$pid
	rgs=$head_rgs rgss=$head_rgss
fi

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
[ -z "$BENCH_BASE" ] || sql "$bmport" "DROP RESOURCE GROUP IF EXISTS bench_meter; CREATE RESOURCE GROUP bench_meter RU_PER_SEC = $limit; ALTER USER 'sbmeter'@'%' RESOURCE GROUP bench_meter"
sleep 1
echo "demand probe: $probe QPS; group bench_meter RU_PER_SEC = $limit"

declare -a on off bon boff
# The proxies' CPU time (clock ticks) and statements, for CPU per statement.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
declare -A cpu stmts pidk portof
pidk=([on]=$mpid [off]=$ppid) portof=([on]=$mport [off]=$pport)
kinds=(on off)
if [ -n "$BENCH_BASE" ]; then
	pidk+=([bon]=$bmpid [boff]=$bppid) portof+=([bon]=$bmport [boff]=$bpport)
	kinds=(on bon off boff)
fi
for k in "${kinds[@]}"; do cpu[$k]=0 stmts[$k]=0; done
msgs0=$(metric "$rgss" rgserver_acquire_tokens_duration_seconds_count "")
stm0=$(metric "$mstatus" rgproxy_group_statements_total 'resource_group="bench_meter"')
for r in $(seq 1 "$BENCH_ROUNDS"); do
	# The order turns every round: each proxy runs first, second, ... as often.
	i=$((r % ${#kinds[@]}))
	line="round $r:"
	for k in "${kinds[@]:$i}" "${kinds[@]:0:$i}"; do
		c0=$(ticks "${pidk[$k]}")
		out=$(sb "${portof[$k]}" "$BENCH_THREADS" "$BENCH_TIME" sbmeter)
		c1=$(ticks "${pidk[$k]}")
		q=$(qps <<<"$out")
		total=$(awk '/queries:/ { print $2; exit }' <<<"$out")
		cpu[$k]=$((${cpu[$k]} + c1 - c0)) stmts[$k]=$((${stmts[$k]} + total))
		case $k in on) on+=("$q") ;; off) off+=("$q") ;; bon) bon+=("$q") ;; boff) boff+=("$q") ;; esac
		line="$line $k $q QPS"
	done
	echo "$line"
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
usper() { awk -v c="${cpu[$1]}" -v n="${stmts[$1]}" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", c / hz * 1e6 / n }'; }
printf "rgproxy CPU per statement: metering on %s us, off %s us\n" "$(usper on)" "$(usper off)"
if [ -n "$BENCH_BASE" ]; then
	bratio=$(awk -v a="${bon[*]}" -v b="${boff[*]}" 'BEGIN { n = split(a, x, " "); split(b, y, " "); for (i = 1; i <= n; i++) { s += x[i]; t += y[i] }; printf "%.3f", s / t }')
	printf "base %s, in the same rotation: QPS ratio on/off %s (this tree %s); rgproxy CPU per statement on %s us, off %s us\n" \
		"$BENCH_BASE" "$bratio" "$ratio" "$(usper bon)" "$(usper boff)"
	printf "metering's CPU per statement (on - off): this tree %s us, base %s us\n" \
		"$(awk -v a="$(usper on)" -v b="$(usper off)" 'BEGIN { printf "%.2f", a - b }')" \
		"$(awk -v a="$(usper bon)" -v b="$(usper boff)" 'BEGIN { printf "%.2f", a - b }')"
fi
printf "token-server messages per 1,000 statements: %s   (target <= 1); statements throttled: %s\n" "$per1000" "${throttled%.*}"
printf "saturation, 3 proxies, %s s at %s RU/s: %s   (target within +-2%%)\n" "$SAT_TIME" "$SAT_RATE" "$acc"
