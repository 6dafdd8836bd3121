#!/usr/bin/env bash
# bench-proxy.sh — `make bench-proxy`: sysbench oltp_point_select against
# MariaDB (a) directly, (b) through HAProxy in TCP mode (a plain L4
# forwarder, the baseline for "what any proxy costs") and (c) through
# rgproxy, at 1 and 8 threads, in alternating rounds so that drift of a
# shared machine hits every target alike. Prints medians of QPS, p95 latency
# and each proxy process's CPU time per statement (utime+stime from
# /proc/PID/stat) and CPU migrations per statement (the kernel moving one
# of its threads to another CPU, se.nr_migrations of /proc/PID/task/*/sched),
# and the ratios rgproxy/HAProxy against the targets:
# QPS >= 0.9x; CPU per statement <= 1.0x at one thread (a single client
# is where a proxy's own cost per statement shows undiluted) and <= 1.2x
# at more.
#
# At one thread sysbench, MariaDB and the proxy hand every statement on in
# turn, and on a small machine where the kernel places the three can move
# the proxy's CPU per statement more than its code does: a proxy whose
# thread follows each waker to the other CPU pays for the move on every
# hop (docs/design.md §4.4a has figures). The migrations column tells such
# a run from one that stayed put; BENCH_PROXY_CPUS runs both proxies on the
# same CPUs.
#
# Then a bulk insert: MariaDB Connector/J (Debian's libmariadb-java) runs
# executeBatch() of BENCH_BULK_ROWS rows, which it sends as one
# COM_STMT_BULK_EXECUTE, directly and through rgproxy in alternating rounds
# (tests/testdata/CapsClient.java, one JVM per round: a warm-up insert,
# then BENCH_BULK_ITER timed ones). Prints the median seconds per insert
# and the ratio of rgproxy's rows/s to direct's against the target >= 0.9x.
#
# Environment (all optional):
#   BENCH_TIME         seconds per sysbench run (default 10)
#   BENCH_ROUNDS       rounds of every target x thread count (default 5: one
#                      run's CPU per statement wanders about 5% on a VM)
#   BENCH_THREADS      thread counts (default "1 8")
#   BENCH_TABLES       sysbench tables (default 4)
#   BENCH_TABLE_SIZE   rows per table (default 10000)
#   BENCH_TARGETS      targets to run (default "direct haproxy rgproxy")
#   BENCH_STRICT       1 = exit 1 when rgproxy misses a target (default 0)
#   MYSQL_HOST, MYSQL_PORT  the MariaDB (default 127.0.0.1:3306, user root, no password)
#   RGPROXY_BIN        rgproxy binary (default bin/rgproxy)
#   RGSERVER_BIN       rgserver binary (default bin/rgserver); rgproxy meters
#                      against a private one, as in production
#   RGPROXY_FLAGS      extra rgproxy flags (default none; "--metering=false"
#                      measures the bare wire path)
#   BENCH_PROXY_CPUS   CPU list both proxies run on, through taskset (default
#                      none: any CPU). Go sizes GOMAXPROCS to it, so "1" gives
#                      rgproxy one P, like HAProxy's one thread on one CPU
#   BENCH_BULK         0 = skip the bulk insert (default 1; it needs direct
#                      and rgproxy among the targets, java and libmariadb-java)
#   BENCH_BULK_ROWS    rows per batch insert (default 10000)
#   BENCH_BULK_ROUNDS  rounds of direct and rgproxy (default 5)
#   BENCH_BULK_ITER    timed inserts per round (default 5)
set -euo pipefail

BENCH_TIME=${BENCH_TIME:-10}
BENCH_ROUNDS=${BENCH_ROUNDS:-5}
BENCH_THREADS=${BENCH_THREADS:-"1 8"}
BENCH_TABLES=${BENCH_TABLES:-4}
BENCH_TABLE_SIZE=${BENCH_TABLE_SIZE:-10000}
BENCH_TARGETS=${BENCH_TARGETS:-"direct haproxy rgproxy"}
BENCH_STRICT=${BENCH_STRICT:-0}
MYSQL_HOST=${MYSQL_HOST:-127.0.0.1}
MYSQL_PORT=${MYSQL_PORT:-3306}
RGPROXY_BIN=${RGPROXY_BIN:-bin/rgproxy}
RGSERVER_BIN=${RGSERVER_BIN:-bin/rgserver}
RGPROXY_FLAGS=${RGPROXY_FLAGS:-}
BENCH_PROXY_CPUS=${BENCH_PROXY_CPUS:-}
BENCH_BULK=${BENCH_BULK:-1}
BENCH_BULK_ROWS=${BENCH_BULK_ROWS:-10000}
BENCH_BULK_ROUNDS=${BENCH_BULK_ROUNDS:-5}
BENCH_BULK_ITER=${BENCH_BULK_ITER:-5}
CONNECTOR_J=/usr/share/java/mariadb-java-client.jar
DB=sbbench

die() { echo "bench-proxy: $*" >&2; exit 1; }

need() {
	command -v "$1" >/dev/null 2>&1 || die "$1 not found; install it with: apt-get install $2"
}
need sysbench sysbench
PIN=()
if [ -n "$BENCH_PROXY_CPUS" ]; then
	need taskset util-linux
	PIN=(taskset -c "$BENCH_PROXY_CPUS")
fi
need mariadb mariadb-client
if [ "$BENCH_BULK" = 1 ] && [[ " $BENCH_TARGETS " == *" direct "* && " $BENCH_TARGETS " == *" rgproxy "* ]]; then
	need java default-jre-headless
	[ -e "$CONNECTOR_J" ] || die "$CONNECTOR_J missing; install it with: apt-get install libmariadb-java (or set BENCH_BULK=0)"
else
	BENCH_BULK=0
fi
for t in $BENCH_TARGETS; do
	case $t in
	direct) ;;
	haproxy) need haproxy haproxy ;;
	rgproxy)
		[ -x "$RGPROXY_BIN" ] || die "$RGPROXY_BIN missing; run make build (or set RGPROXY_BIN)"
		[ -x "$RGSERVER_BIN" ] || die "$RGSERVER_BIN missing; run make build (or set RGSERVER_BIN)"
		;;
	*) die "unknown target $t (want direct, haproxy, rgproxy)" ;;
	esac
done

CLK_TCK=$(getconf CLK_TCK)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-proxy.XXXXXX")
PIDS=()
cleanup() {
	# Only the processes this script started, by their id.
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

sql() { mariadb --no-defaults -h "$MYSQL_HOST" -P "$MYSQL_PORT" -uroot -N -B -e "$1"; }

# free_port prints a loopback port nobody listens on.
free_port() {
	local p
	for _ in $(seq 100); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	die "no free port found"
}

wait_port() { # port pid name
	for _ in $(seq 200); do
		kill -0 "$2" 2>/dev/null || die "$3 exited; log: $(cat "$WORK/$3.log")"
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return; fi
		sleep 0.1
	done
	die "$3 does not listen on 127.0.0.1:$1 after 20 s; log: $(cat "$WORK/$3.log")"
}

# cpu_ticks prints utime+stime of a process in clock ticks (fields 14 and
# 15 of /proc/PID/stat, counted after the parenthesised command name).
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

# migrations prints how often the kernel moved a thread of a process to
# another CPU, summed over its threads, or - where the kernel does not say
# (no /proc/PID/task/TID/sched without CONFIG_SCHED_DEBUG).
migrations() {
	cat "/proc/$1"/task/*/sched 2>/dev/null | awk '/^se.nr_migrations/ {s += $3; n++} END {print n ? s : "-"}'
}

sysbench_args() { # port threads
	echo --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$1" --mysql-user=root \
		--mysql-db="$DB" --tables="$BENCH_TABLES" --table-size="$BENCH_TABLE_SIZE" \
		--threads="$2" --percentile=95
}

sql "SELECT 1" >/dev/null || die "no MariaDB answers on $MYSQL_HOST:$MYSQL_PORT as root (scripts/ensure-mariadb.sh starts one)"

# Prepare the data once; later runs reuse it when it is complete.
sql "CREATE DATABASE IF NOT EXISTS $DB"
rows=$(sql "SELECT COALESCE(SUM(table_rows),0) FROM information_schema.tables WHERE table_schema='$DB'")
have=$(sql "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema='$DB'")
last=$(sql "SELECT COUNT(*) FROM $DB.sbtest$BENCH_TABLES" 2>/dev/null || echo 0)
if [ "$have" != "$BENCH_TABLES" ] || [ "$last" != "$BENCH_TABLE_SIZE" ]; then
	echo "preparing $DB: $BENCH_TABLES tables x $BENCH_TABLE_SIZE rows (had $have tables, ~$rows rows)"
	# shellcheck disable=SC2046
	sysbench oltp_point_select $(sysbench_args "$MYSQL_PORT" 1) cleanup >/dev/null
	# shellcheck disable=SC2046
	sysbench oltp_point_select $(sysbench_args "$MYSQL_PORT" 4) prepare >"$WORK/prepare.log" 2>&1 ||
		die "sysbench prepare failed: $(tail -5 "$WORK/prepare.log")"
fi

declare -A PORT PID
PORT[direct]=$MYSQL_PORT
PID[direct]=

for t in $BENCH_TARGETS; do
	case $t in
	haproxy)
		PORT[haproxy]=$(free_port)
		cat >"$WORK/haproxy.cfg" <<EOF
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend mysql
    bind 127.0.0.1:${PORT[haproxy]}
    default_backend mariadb
backend mariadb
    server db $MYSQL_HOST:$MYSQL_PORT
EOF
		"${PIN[@]}" haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
		PID[haproxy]=$!
		PIDS+=("$!")
		wait_port "${PORT[haproxy]}" "${PID[haproxy]}" haproxy
		;;
	rgproxy)
		rgs_port=$(free_port)
		"$RGSERVER_BIN" --addr "127.0.0.1:$rgs_port" --status-addr "127.0.0.1:$(free_port)" \
			--data-dir "$WORK/rgserver-data" --log-level warn >"$WORK/rgserver.log" 2>&1 &
		PIDS+=("$!")
		wait_port "$rgs_port" "$!" rgserver
		PORT[rgproxy]=$(free_port)
		# shellcheck disable=SC2086
		"${PIN[@]}" "$RGPROXY_BIN" --listen "127.0.0.1:${PORT[rgproxy]}" --status-addr "127.0.0.1:$(free_port)" \
			--backend "$MYSQL_HOST:$MYSQL_PORT" --token-server "127.0.0.1:$rgs_port" \
			--cache-dir "$WORK/rgproxy-cache" --log-level warn $RGPROXY_FLAGS >"$WORK/rgproxy.log" 2>&1 &
		PID[rgproxy]=$!
		PIDS+=("$!")
		wait_port "${PORT[rgproxy]}" "${PID[rgproxy]}" rgproxy
		;;
	esac
done

RESULTS=$WORK/results # target threads round qps p95ms cpu_us_per_stmt migrations_per_stmt
: >"$RESULTS"
targets=($BENCH_TARGETS)
echo "sysbench oltp_point_select, ${BENCH_TIME}s per run, $BENCH_ROUNDS rounds, threads: $BENCH_THREADS${BENCH_PROXY_CPUS:+, proxies on CPUs $BENCH_PROXY_CPUS}"
for round in $(seq "$BENCH_ROUNDS"); do
	for threads in $BENCH_THREADS; do
		# Rotate the order each round so no target always runs first.
		n=${#targets[@]}
		for i in $(seq 0 $((n - 1))); do
			t=${targets[$(((i + round - 1) % n))]}
			pid=${PID[$t]}
			before=0 mbefore=-
			[ -n "$pid" ] && before=$(cpu_ticks "$pid") && mbefore=$(migrations "$pid")
			# shellcheck disable=SC2046
			if ! sysbench oltp_point_select $(sysbench_args "${PORT[$t]}" "$threads") \
				--time="$BENCH_TIME" --report-interval=0 run >"$WORK/run.log" 2>&1; then
				die "sysbench via $t failed: $(tail -5 "$WORK/run.log")"
			fi
			after=0 mafter=-
			[ -n "$pid" ] && after=$(cpu_ticks "$pid") && mafter=$(migrations "$pid")
			queries=$(awk '/^ +queries:/ {print $2}' "$WORK/run.log")
			qps=$(awk '/^ +queries:/ {gsub(/\(/, "", $3); print $3}' "$WORK/run.log")
			p95=$(awk '/95th percentile:/ {print $3}' "$WORK/run.log")
			errs=$(awk '/ignored errors:/ {print $3}' "$WORK/run.log")
			[ -n "$queries" ] && [ "$queries" -gt 0 ] || die "no statements via $t: $(tail -20 "$WORK/run.log")"
			[ "${errs:-0}" = 0 ] || echo "warning: $errs ignored errors via $t" >&2
			cpu=-
			[ -n "$pid" ] && cpu=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v q="$queries" \
				'BEGIN {printf "%.2f", d * 1e6 / hz / q}')
			mig=-
			[ "$mbefore" != - ] && [ "$mafter" != - ] && mig=$(awk -v d=$((mafter - mbefore)) -v q="$queries" \
				'BEGIN {printf "%.2f", d / q}')
			echo "$t $threads $round $qps $p95 $cpu $mig" >>"$RESULTS"
			printf '  round %d  %-8s %2d threads  %10.1f qps  p95 %6.2f ms  cpu/stmt %s us  migrations/stmt %s\n' \
				"$round" "$t" "$threads" "$qps" "$p95" "$cpu" "$mig"
		done
	done
done

# median of column $3 for target $1, threads $2
median() {
	awk -v t="$1" -v th="$2" -v c="$3" '$1 == t && $2 == th && $c != "-" {print $c}' "$RESULTS" |
		sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b}'; }

echo
echo "medians of $BENCH_ROUNDS rounds (cpu/stmt: the proxy process's utime+stime per statement; migr/stmt: its threads' moves to another CPU)"
printf '%-8s %7s %12s %10s %14s %10s\n' target threads QPS "p95 ms" "cpu/stmt us" "migr/stmt"
for threads in $BENCH_THREADS; do
	for t in $BENCH_TARGETS; do
		printf '%-8s %7s %12s %10s %14s %10s\n' "$t" "$threads" "$(median "$t" "$threads" 4)" \
			"$(median "$t" "$threads" 5)" "$(median "$t" "$threads" 6)" "$(median "$t" "$threads" 7)"
	done
done

missed=0
if [[ " $BENCH_TARGETS " == *" haproxy "* && " $BENCH_TARGETS " == *" rgproxy "* ]]; then
	echo
	for threads in $BENCH_THREADS; do
		q=$(ratio "$(median rgproxy "$threads" 4)" "$(median haproxy "$threads" 4)")
		c=$(ratio "$(median rgproxy "$threads" 6)" "$(median haproxy "$threads" 6)")
		qok=$(awk -v r="$q" 'BEGIN {print (r != "-" && r >= 0.9) ? "ok" : "MISSED"}')
		cmax=1.20
		[ "$threads" = 1 ] && cmax=1.00
		cok=$(awk -v r="$c" -v m="$cmax" 'BEGIN {print (r != "-" && r <= m) ? "ok" : "MISSED"}')
		printf 'rgproxy/haproxy at %s threads: QPS %s (target >= 0.90: %s), cpu/stmt %s (target <= %s: %s)\n' \
			"$threads" "$q" "$qok" "$c" "$cmax" "$cok"
		[ "$qok" = ok ] && [ "$cok" = ok ] || missed=1
	done
fi

if [ "$BENCH_BULK" = 1 ]; then
	BULK=$WORK/bulk # target seconds
	: >"$BULK"
	echo
	echo "Connector/J executeBatch() of $BENCH_BULK_ROWS rows (one COM_STMT_BULK_EXECUTE), $BENCH_BULK_ROUNDS rounds x $BENCH_BULK_ITER inserts"
	for round in $(seq "$BENCH_BULK_ROUNDS"); do
		order="direct rgproxy"
		[ $((round % 2)) = 0 ] && order="rgproxy direct"
		for t in $order; do
			if ! java -Ddb="$DB" -cp "$CONNECTOR_J" tests/testdata/CapsClient.java bench "127.0.0.1:${PORT[$t]}" \
				bench_bulk "$BENCH_BULK_ROWS" "$BENCH_BULK_ITER" >"$WORK/bulk.log" 2>&1; then
				die "Connector/J bulk insert via $t failed: $(tail -5 "$WORK/bulk.log")"
			fi
			grep -q 'counts=\[-2\]' "$WORK/bulk.log" || die "Connector/J did not use a bulk insert via $t: $(tail -3 "$WORK/bulk.log")"
			sed -n 's/^seconds=\([0-9.]*\).*/\1/p' "$WORK/bulk.log" | while read -r s; do echo "$t $s"; done >>"$BULK"
			printf '  round %d  %-8s %s s\n' "$round" "$t" "$(sed -n 's/^seconds=\([0-9.]*\).*/\1/p' "$WORK/bulk.log" | tr '\n' ' ')"
		done
	done
	bmedian() { awk -v t="$1" '$1 == t {print $2}' "$BULK" | sort -g |
		awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
	d=$(bmedian direct)
	r=$(bmedian rgproxy)
	echo
	printf '%-8s %12s %12s\n' target "median s" "rows/s"
	for t in direct rgproxy; do
		m=$(bmedian "$t")
		printf '%-8s %12s %12.0f\n' "$t" "$m" "$(awk -v m="$m" -v n="$BENCH_BULK_ROWS" 'BEGIN {print n / m}')"
	done
	b=$(ratio "$d" "$r")
	bok=$(awk -v r="$b" 'BEGIN {print (r != "-" && r >= 0.9) ? "ok" : "MISSED"}')
	printf 'rgproxy/direct bulk insert rows/s: %s (target >= 0.90: %s)\n' "$b" "$bok"
	[ "$bok" = ok ] || missed=1
fi
if [ "$missed" = 1 ] && [ "$BENCH_STRICT" = 1 ]; then
	exit 1
fi
