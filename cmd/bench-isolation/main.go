// Command bench-isolation is the noisy-neighbour experiment behind `make
// bench-isolation`: a victim runs paced point selects in the default
// group while an aggressor of several sessions repeats a heavy statement
// (a CPU-bound scan, or a sort) in a group with a small RU_PER_SEC. It
// measures, side by side in one run, the victim's p99 alone and beside the
// aggressor, directly and through rgproxy, in rounds that alternate the
// two (so that the machine's drift lands on both sides of the ratio); over
// one continuous throttled phase, the aggressor group's RU
// against RU_PER_SEC × T + its bucket's capacity; the RU of one heavy
// statement alone and beside copies of it running directly on the backend
// (which CPU-true metering keeps close, and wall-time metering does not);
// and, last, a control: the victim through rgproxy beside the heavy
// statement run directly, one at a time, at the pace RU_PER_SEC pays for
// (what an ideal admission would leave the victim), paired the same way.
//
// It starts its own rgserver and rgproxy from --bin-dir and uses the
// MariaDB at --backend as root.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rgproxy/rgproxy/ru"
)

// config is bench-isolation's command line.
type config struct {
	// Backend is the MariaDB/MySQL address; root with an empty password.
	Backend string
	// BinDir holds rgproxy and rgserver.
	BinDir string
	// Rows is the size of the heavy table. Default 200,000.
	Rows int
	// Phase is how long the victim runs alone, and then beside the
	// aggressor, in each round. Default 10 s.
	Phase time.Duration
	// Warmup is how long the aggressor runs before the victim's phase
	// beside it starts: its group's bucket, full after the victim's phase
	// alone, is spent by then, and the steady state is what the phase
	// measures. Default 2 s (the bucket holds one second of RU_PER_SEC).
	Warmup time.Duration
	// Throttled is how long the victim runs beside the aggressor through
	// rgproxy in one continuous phase: the window over which the
	// aggressor's RU is checked. Default 60 s.
	Throttled time.Duration
	// Rounds of the victim alone then beside the aggressor, directly,
	// through rgproxy and for the control; each p99 is over all the
	// rounds' statements on its side. Default 3.
	Rounds int
	// OneRounds of one heavy statement alone then beside direct copies;
	// the ratio is the median of the rounds' ratios. Default 5.
	OneRounds int
	// VictimRate is the victim's statements per second; VictimThreads the
	// sessions that share them. Defaults 300 and 2.
	VictimRate    int
	VictimThreads int
	// Aggressors is the aggressor's sessions. Default 8.
	Aggressors int
	// RUPerSec is the aggressor group's limit. Default 100.
	RUPerSec int
	// Kinds are the aggressor statements to run: scan, sort. Default both.
	Kinds []string
	// CPUSource is rgproxy's --cpu-source. Default auto.
	CPUSource string
	// JSON prints the results as one JSON object instead of a table.
	JSON bool
}

// aggressorQueries are the heavy statements, by kind.
var aggressorQueries = map[string]string{
	// A CPU-bound full scan: no index helps LIKE '%7%7%7%'.
	"scan": "SELECT COUNT(*), SUM(k) FROM rgproxy_bench.heavy WHERE c LIKE '%7%7%7%'",
	// A sort of the whole table on an unindexed expression.
	"sort": "SELECT id FROM rgproxy_bench.heavy ORDER BY CRC32(c) DESC LIMIT 5",
}

// oneRuns is how many times the one-statement RU is measured in a round,
// alone and beside; the round's figure is the median.
const oneRuns = 3

// sleepQuery checks that waiting is not charged as CPU.
const sleepQuery = "SELECT SLEEP(1)"

// victimQuery is a primary-key point select.
const victimQuery = "SELECT k FROM rgproxy_bench.heavy WHERE id = ?"

// Result is one aggressor kind's figures.
type Result struct {
	Kind string `json:"kind"`
	// Victim p99 latencies in milliseconds, from the paired rounds.
	DirectAloneP99  float64 `json:"direct_alone_p99_ms"`
	DirectBesideP99 float64 `json:"direct_beside_p99_ms"`
	ProxyAloneP99   float64 `json:"proxy_alone_p99_ms"`
	ProxyBesideP99  float64 `json:"proxy_beside_p99_ms"`
	DirectRatio     float64 `json:"direct_ratio"`
	ProxyRatio      float64 `json:"proxy_ratio"`
	// The victim's p99 over the whole continuous throttled phase, and as
	// the median of its Phase-long windows' p99.
	ThrottledP99         float64 `json:"throttled_p99_ms"`
	ProxyBesideWindowP99 float64 `json:"proxy_beside_window_p99_ms"`
	// The control (see the package doc): the victim's p99 through rgproxy
	// alone and beside the heavy statement paced directly at RU_PER_SEC,
	// in paired rounds.
	PacedAloneP99       float64 `json:"paced_alone_p99_ms"`
	PacedBesideP99      float64 `json:"paced_beside_p99_ms"`
	PacedRatio          float64 `json:"paced_ratio"`
	VictimErrors        int64   `json:"victim_errors"`
	AggressorStatements int64   `json:"aggressor_statements"`
	AggressorErrors     int64   `json:"aggressor_errors"`
	// The aggressor group's RU over the throttled phase, against
	// RU_PER_SEC × T + capacity.
	AggressorRU    float64 `json:"aggressor_ru"`
	AggressorLimit float64 `json:"aggressor_limit"`
	AggressorOver  float64 `json:"aggressor_over"`
	// AggressorWaited is the time its statements waited for tokens in
	// all, in seconds: near 0 when the machine could not run it as fast
	// as its limit, and then AggressorOver says nothing of the limit.
	AggressorWaited float64 `json:"aggressor_waited_s"`
	// One heavy statement's RU alone and beside copies running directly
	// (each round's figure the median of oneRuns runs; these the medians
	// over rounds, and of the rounds' ratios), and the same for its wall
	// time: what wall-time metering would charge it.
	OneAloneRU     float64   `json:"one_alone_ru"`
	OneBesideRU    float64   `json:"one_beside_ru"`
	OneRatio       float64   `json:"one_ratio"`
	OneAloneWall   float64   `json:"one_alone_wall_ms"`
	OneBesideWall  float64   `json:"one_beside_wall_ms"`
	OneWallRatio   float64   `json:"one_wall_ratio"`
	OneRatioRounds []float64 `json:"one_ratio_rounds"`
}

// Report is everything one run measured.
type Report struct {
	CPUSource string  `json:"cpu_source"`
	SleepCPU  float64 `json:"sleep_1s_cpu_ru"`
	// SleepCPURuns is each run's CPU RU of SELECT SLEEP(1), in order: the
	// first is on a new session, the rest on a known shape.
	SleepCPURuns []float64 `json:"sleep_1s_cpu_ru_runs"`
	Results      []Result  `json:"results"`
}

func main() {
	cfg, err := parseArgs(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-isolation:", err)
		os.Exit(2)
	}
	rep, err := run(context.Background(), cfg, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-isolation:", err)
		os.Exit(1)
	}
	if cfg.JSON {
		_ = json.NewEncoder(os.Stdout).Encode(rep)
		return
	}
	printReport(os.Stdout, cfg, rep)
}

func parseArgs(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("bench-isolation", flag.ContinueOnError)
	fs.StringVar(&cfg.Backend, "backend", "127.0.0.1:3306", "MariaDB/MySQL `address` (root, empty password)")
	fs.StringVar(&cfg.BinDir, "bin-dir", "bin", "`directory` holding rgproxy and rgserver")
	fs.IntVar(&cfg.Rows, "rows", 200000, "rows of the heavy table")
	fs.DurationVar(&cfg.Phase, "phase", 10*time.Second, "victim alone, then beside the aggressor, in each round")
	fs.DurationVar(&cfg.Warmup, "warmup", 2*time.Second, "the aggressor runs this long before the victim's phase beside it")
	fs.DurationVar(&cfg.Throttled, "throttled", 60*time.Second, "victim beside the aggressor through rgproxy, in one continuous phase (the aggressor's RU check)")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds of the victim alone then beside the aggressor; each p99 is over all rounds")
	fs.IntVar(&cfg.OneRounds, "one-rounds", 5, "rounds of one heavy statement alone then beside direct copies; the ratio is the median of the rounds'")
	fs.IntVar(&cfg.VictimRate, "victim-rate", 300, "victim statements per second")
	fs.IntVar(&cfg.VictimThreads, "victim-threads", 2, "victim sessions")
	fs.IntVar(&cfg.Aggressors, "aggressors", 8, "aggressor sessions")
	fs.IntVar(&cfg.RUPerSec, "ru-per-sec", 100, "the aggressor group's RU_PER_SEC")
	kinds := fs.String("kinds", "scan,sort", "aggressor statements: scan, sort")
	fs.StringVar(&cfg.CPUSource, "cpu-source", "auto", "rgproxy's --cpu-source")
	fs.BoolVar(&cfg.JSON, "json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	for _, k := range strings.Split(*kinds, ",") {
		if _, ok := aggressorQueries[k]; !ok {
			return cfg, fmt.Errorf("--kinds: unknown aggressor %q (scan, sort)", k)
		}
		cfg.Kinds = append(cfg.Kinds, k)
	}
	if cfg.VictimRate <= 0 || cfg.VictimThreads <= 0 || cfg.Aggressors <= 0 || cfg.RUPerSec <= 0 || cfg.Rows <= 0 || cfg.Rounds <= 0 || cfg.OneRounds <= 0 {
		return cfg, errors.New("rates, sessions and rows must be > 0")
	}
	if cfg.Phase <= 0 || cfg.Throttled <= 0 || cfg.Warmup < 0 {
		return cfg, errors.New("--phase and --throttled must be > 0, --warmup ≥ 0")
	}
	return cfg, nil
}

func run(ctx context.Context, cfg config, logw io.Writer) (*Report, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, format+"\n", args...) }
	root, err := openDB(cfg.Backend, "root", "")
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if err := setup(ctx, root, cfg.Rows, logf); err != nil {
		return nil, err
	}
	sys, err := startSystem(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	admin, err := openDB(sys.proxy, "root", "")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	for _, q := range []string{
		"DROP RESOURCE GROUP IF EXISTS rg_aggressor",
		fmt.Sprintf("CREATE RESOURCE GROUP rg_aggressor RU_PER_SEC = %d", cfg.RUPerSec),
		"ALTER USER 'bench_aggr'@'%' RESOURCE GROUP rg_aggressor",
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("%s: %w", q, err)
		}
	}
	time.Sleep(time.Second) // the binding reaches the proxy's cache

	rep := &Report{}
	if rep.CPUSource, err = sys.cpuSource(); err != nil {
		return nil, err
	}
	// The largest of the runs: once its shape is known, a waiting
	// statement must still be read as the little CPU it is.
	sleepRUs, _, err := statementRUs(ctx, sys.proxy, "root", sleepQuery)
	if err != nil {
		return nil, err
	}
	coef := ru.DefaultConfig()
	base := coef.ReadBaseCost + coef.ReadPerRequestBaseCost // what is left is CPU (and 43 bytes)
	for _, v := range sleepRUs {
		rep.SleepCPURuns = append(rep.SleepCPURuns, v-base)
	}
	rep.SleepCPU = slices.Max(rep.SleepCPURuns)
	for _, kind := range cfg.Kinds {
		q := aggressorQueries[kind]
		r := Result{Kind: kind}
		// Each comparison alternates the victim alone and beside the
		// aggressor, round by round, so that a slow spell of the machine
		// lands on both sides of the ratio; each side's p99 is over all
		// its rounds' statements.
		paired := func(what, victimAddr, aggrAddr string, sessions int, every time.Duration) (alone, beside *latencies) {
			alone, beside = &latencies{}, &latencies{}
			for round := 1; round <= cfg.Rounds; round++ {
				logf("%s, round %d/%d: victim alone, then beside %s", kind, round, cfg.Rounds, what)
				alone.merge(victim(ctx, cfg, victimAddr, cfg.Phase))
				v, _ := besideAggressor(ctx, cfg, victimAddr, aggrAddr, q, cfg.Phase, cfg.Warmup, sessions, every)
				logf("%s, round %d/%d: victim p99 by second beside %s (ms): %.2f", kind, round, cfg.Rounds, what, v.windows(time.Second, 100))
				beside.merge(v)
			}
			return alone, beside
		}
		dAlone, dBeside := paired("the aggressor, direct", cfg.Backend, cfg.Backend, cfg.Aggressors, 0)
		r.DirectAloneP99, r.DirectBesideP99 = dAlone.p99(), dBeside.p99()
		r.DirectRatio = r.DirectBesideP99 / r.DirectAloneP99
		logf("%s: victim beside the aggressor, through rgproxy (%v, continuous)", kind, cfg.Throttled)
		// The aggressor has not used its group yet: the bucket is full, as
		// after any idle spell, and the capacity counts in the limit.
		time.Sleep(1500 * time.Millisecond)
		before, err := sys.groupRU("rg_aggressor")
		if err != nil {
			return nil, err
		}
		waitBefore, err := sys.groupWait("rg_aggressor")
		if err != nil {
			return nil, err
		}
		v, a := besideAggressor(ctx, cfg, sys.proxy, sys.proxy, q, cfg.Throttled, 0, cfg.Aggressors, 0)
		after, err := sys.groupRU("rg_aggressor")
		if err != nil {
			return nil, err
		}
		waitAfter, err := sys.groupWait("rg_aggressor")
		if err != nil {
			return nil, err
		}
		r.AggressorWaited = waitAfter - waitBefore
		r.ThrottledP99, r.ProxyBesideWindowP99 = v.p99(), v.windowP99(cfg.Phase)
		logf("%s: victim p99 by second of the continuous phase (ms): %.2f", kind, v.windows(time.Second, 100))
		r.VictimErrors += v.errors.Load()
		r.AggressorStatements, r.AggressorErrors = a.statements.Load(), a.errors.Load()
		r.AggressorRU = after - before
		r.AggressorLimit = float64(cfg.RUPerSec)*a.elapsed.Seconds() + float64(cfg.RUPerSec)
		r.AggressorOver = r.AggressorRU/r.AggressorLimit - 1

		// Each round starts with the victim alone: the group's bucket
		// refills from what the throttled phase left.
		pAlone, pBeside := paired("the aggressor, through rgproxy", sys.proxy, sys.proxy, cfg.Aggressors, 0)
		r.ProxyAloneP99, r.ProxyBesideP99 = pAlone.p99(), pBeside.p99()
		r.ProxyRatio = r.ProxyBesideP99 / r.ProxyAloneP99
		r.VictimErrors += pAlone.errors.Load() + pBeside.errors.Load()

		// One statement's RU alone, then beside copies, in short rounds:
		// the same scan's CPU time alone spreads over ±30% from one run to
		// the next on a shared 2-vCPU VM (107–196 ms of CPU in one minute,
		// busy or not: a memory-bound scan's cycles follow the caches), so
		// one batch against the next reads up to 1.4× with nothing beside
		// it. Each round's ratio compares neighbours in time, and the
		// figures are the medians of many rounds.
		var oneAlone, oneBeside, oneRatio, aloneWall, besideWall, wallRatio []float64
		for round := 1; round <= cfg.OneRounds; round++ {
			logf("%s, round %d/%d: one heavy statement alone, then beside %d direct copies", kind, round, cfg.OneRounds, cfg.Aggressors)
			alone, aWall, err := oneStatementRU(ctx, sys.proxy, "root", q)
			if err != nil {
				return nil, err
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			loadDirect(cfg.Backend, q, cfg.Aggressors, stop, &wg)
			time.Sleep(500 * time.Millisecond)
			beside, bWall, err := oneStatementRU(ctx, sys.proxy, "root", q)
			close(stop)
			wg.Wait()
			if err != nil {
				return nil, err
			}
			oneAlone, oneBeside, oneRatio = append(oneAlone, alone), append(oneBeside, beside), append(oneRatio, beside/alone)
			aloneWall, besideWall, wallRatio = append(aloneWall, aWall), append(besideWall, bWall), append(wallRatio, bWall/aWall)
		}
		r.OneAloneRU, r.OneBesideRU, r.OneRatio = median(oneAlone), median(oneBeside), median(oneRatio)
		r.OneAloneWall, r.OneBesideWall, r.OneWallRatio = median(aloneWall), median(besideWall), median(wallRatio)
		r.OneRatioRounds = oneRatio

		// The control: one session straight on the backend, a statement
		// every stmtRU ÷ RU_PER_SEC seconds: the pace the group's rate pays
		// for, with none of the proxy's admission in the way.
		every := time.Duration(r.OneAloneRU / float64(cfg.RUPerSec) * float64(time.Second))
		cAlone, cBeside := paired(fmt.Sprintf("the statement paced directly at %d RU/s (control)", cfg.RUPerSec), sys.proxy, cfg.Backend, 1, every)
		r.PacedAloneP99, r.PacedBesideP99 = cAlone.p99(), cBeside.p99()
		r.PacedRatio = r.PacedBesideP99 / r.PacedAloneP99
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// setup creates rgproxy_bench.heavy with rows rows (when it has another
// size) and the aggressor's user.
func setup(ctx context.Context, db *sql.DB, rows int, logf func(string, ...any)) error {
	stmts := []string{
		"CREATE DATABASE IF NOT EXISTS rgproxy_bench",
		"CREATE TABLE IF NOT EXISTS rgproxy_bench.heavy (id INT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL)",
		"CREATE USER IF NOT EXISTS 'bench_aggr'@'%' IDENTIFIED BY 'benchpw'",
		"GRANT SELECT ON rgproxy_bench.* TO 'bench_aggr'@'%'",
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM rgproxy_bench.heavy").Scan(&n); err != nil {
		return err
	}
	if n == rows {
		return nil
	}
	logf("filling rgproxy_bench.heavy with %d rows", rows)
	if _, err := db.ExecContext(ctx, "TRUNCATE rgproxy_bench.heavy"); err != nil {
		return err
	}
	// Sysbench's shape: c is eleven groups of digits.
	fill := "INSERT INTO rgproxy_bench.heavy SELECT seq, FLOOR(RAND(seq) * 1000000), " +
		"CONCAT_WS('-', LPAD(FLOOR(RAND(seq*7)*1e10), 10, '0'), LPAD(FLOOR(RAND(seq*11)*1e10), 10, '0'), " +
		"LPAD(FLOOR(RAND(seq*13)*1e10), 10, '0'), LPAD(FLOOR(RAND(seq*17)*1e10), 10, '0'), " +
		"LPAD(FLOOR(RAND(seq*19)*1e10), 10, '0'), LPAD(FLOOR(RAND(seq*23)*1e10), 10, '0'), " +
		"LPAD(FLOOR(RAND(seq*29)*1e10), 10, '0'), LPAD(FLOOR(RAND(seq*31)*1e10), 10, '0'), " +
		"LPAD(FLOOR(RAND(seq*37)*1e10), 10, '0'), LPAD(FLOOR(RAND(seq*41)*1e10), 10, '0'), " +
		"LPAD(FLOOR(RAND(seq*43)*1e10), 10, '0')) FROM rgproxy_bench.seq_1_to_" + strconv.Itoa(rows)
	if _, err := db.ExecContext(ctx, fill); err != nil {
		return fmt.Errorf("filling the heavy table (needs MariaDB's SEQUENCE engine): %w", err)
	}
	return nil
}

func openDB(addr, user, pass string) (*sql.DB, error) {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr = user, pass, "tcp", addr
	c.InterpolateParams = true
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect %s as %s: %w", addr, user, err)
	}
	return db, nil
}

// median of xs (the mean of the two middle ones for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// latencies collects a load's statement latencies.
type latencies struct {
	mu         sync.Mutex
	d          []time.Duration
	at         []time.Time // when each statement of d started
	errors     atomic.Int64
	statements atomic.Int64
	elapsed    time.Duration
}

func (l *latencies) add(start time.Time, d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.at = append(l.at, start)
	l.mu.Unlock()
}

// merge adds o's statements and errors to l.
func (l *latencies) merge(o *latencies) {
	o.mu.Lock()
	d, at := o.d, o.at
	o.mu.Unlock()
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.at = append(l.at, at...)
	l.mu.Unlock()
	l.errors.Add(o.errors.Load())
	l.statements.Add(o.statements.Load())
	l.elapsed += o.elapsed
}

// windowP99 is the median over consecutive windows of length w of each
// window's p99, in milliseconds: a steady-state figure that one spell (the
// first seconds of a throttled phase, when the group spends the capacity
// it saved while idle; a hiccup of the machine) does not decide. Windows
// with fewer than 100 statements are left out.
func (l *latencies) windowP99(w time.Duration) float64 {
	return median(l.windows(w, 100))
}

// windows is each consecutive window of length w's p99 in milliseconds,
// in order, leaving out windows with fewer than min statements.
func (l *latencies) windows(w time.Duration, min int) []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return nil
	}
	first := slices.MinFunc(l.at, func(a, b time.Time) int { return a.Compare(b) })
	var byWindow [][]time.Duration
	for i, d := range l.d {
		k := int(l.at[i].Sub(first) / w)
		for len(byWindow) <= k {
			byWindow = append(byWindow, nil)
		}
		byWindow[k] = append(byWindow[k], d)
	}
	var p99s []float64
	for _, ds := range byWindow {
		if len(ds) < min {
			continue
		}
		slices.Sort(ds)
		p99s = append(p99s, float64(ds[len(ds)*99/100])/float64(time.Millisecond))
	}
	return p99s
}

// p99 is the 99th percentile in milliseconds.
func (l *latencies) p99() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return float64(s[len(s)*99/100]) / float64(time.Millisecond)
}

// victim runs the paced point selects against addr for d.
func victim(ctx context.Context, cfg config, addr string, d time.Duration) *latencies {
	res := &latencies{}
	db, err := openDB(addr, "root", "")
	if err != nil {
		res.errors.Add(1)
		return res
	}
	defer db.Close()
	db.SetMaxOpenConns(cfg.VictimThreads)
	every := time.Duration(float64(time.Second) * float64(cfg.VictimThreads) / float64(cfg.VictimRate))
	start := time.Now()
	var wg sync.WaitGroup
	for th := 0; th < cfg.VictimThreads; th++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(ctx)
			if err != nil {
				res.errors.Add(1)
				return
			}
			defer conn.Close()
			next := time.Now().Add(time.Duration(th) * every / time.Duration(cfg.VictimThreads))
			for i := 0; ; i++ {
				if time.Until(next) > 0 {
					time.Sleep(time.Until(next))
				}
				if time.Since(start) >= d {
					return
				}
				t0 := time.Now()
				var k int
				if err := conn.QueryRowContext(ctx, victimQuery, 1+(i*7919+th*104729)%cfg.Rows).Scan(&k); err != nil {
					res.errors.Add(1)
				} else {
					res.add(t0, time.Since(t0))
				}
				next = next.Add(every)
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// besideAggressor runs the victim against victimAddr for d while sessions
// aggressor sessions (as bench_aggr) repeat q against aggrAddr, back to
// back or, with every > 0, each starting one statement every every. The
// aggressor starts warmup before the victim and stops with it; it returns
// when the aggressor's last statement has ended.
func besideAggressor(ctx context.Context, cfg config, victimAddr, aggrAddr, q string, d, warmup time.Duration, sessions int, every time.Duration) (*latencies, *latencies) {
	aggr := &latencies{}
	db, err := openDB(aggrAddr, "bench_aggr", "benchpw")
	if err != nil {
		aggr.errors.Add(1)
		return victim(ctx, cfg, victimAddr, d), aggr
	}
	defer db.Close()
	db.SetMaxOpenConns(sessions)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(ctx)
			if err != nil {
				aggr.errors.Add(1)
				return
			}
			defer conn.Close()
			next := time.Now()
			for {
				if every > 0 {
					select {
					case <-stop:
						return
					case <-time.After(time.Until(next)):
					}
					next = next.Add(every)
				} else {
					select {
					case <-stop:
						return
					default:
					}
				}
				if _, err := conn.ExecContext(ctx, q); err != nil {
					aggr.errors.Add(1)
					time.Sleep(20 * time.Millisecond)
					continue
				}
				aggr.statements.Add(1)
			}
		}()
	}
	time.Sleep(warmup)
	v := victim(ctx, cfg, victimAddr, d)
	close(stop)
	wg.Wait()
	aggr.elapsed = time.Since(start)
	return v, aggr
}

// loadDirect starts n sessions repeating q on addr as root until stop.
func loadDirect(addr, q string, n int, stop chan struct{}, wg *sync.WaitGroup) {
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := openDB(addr, "root", "")
			if err != nil {
				return
			}
			defer db.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = db.Exec(q)
			}
		}()
	}
}

// oneStatementRU runs q through rgproxy, oneRuns times, and returns the
// median of its RU (SHOW LAST STATEMENT RU on the same session) and of its
// wall time in milliseconds.
func oneStatementRU(ctx context.Context, addr, user, q string) (ru, wallMS float64, err error) {
	rus, walls, err := statementRUs(ctx, addr, user, q)
	if err != nil {
		return 0, 0, err
	}
	return median(rus), median(walls), nil
}

// statementRUs runs q through rgproxy oneRuns times on one session and
// returns each run's RU and wall time in milliseconds.
func statementRUs(ctx context.Context, addr, user, q string) (rus, walls []float64, err error) {
	db, err := openDB(addr, user, "")
	if err != nil {
		return nil, nil, err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	for range oneRuns {
		start := time.Now()
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", q, err)
		}
		walls = append(walls, float64(time.Since(start).Microseconds())/1e3)
		v, err := lastStatementRU(ctx, conn)
		if err != nil {
			return nil, nil, err
		}
		rus = append(rus, v)
	}
	return rus, walls, nil
}

// lastStatementRU is SHOW LAST STATEMENT RU's RRU + WRU on conn.
func lastStatementRU(ctx context.Context, conn *sql.Conn) (float64, error) {
	rows, err := conn.QueryContext(ctx, "SHOW LAST STATEMENT RU")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil || !rows.Next() {
		return 0, fmt.Errorf("SHOW LAST STATEMENT RU: no row (%v)", err)
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return 0, err
	}
	total := 0.0
	for i, c := range cols {
		if c == "RRU" || c == "WRU" {
			v, err := strconv.ParseFloat(vals[i].String, 64)
			if err != nil {
				return 0, fmt.Errorf("SHOW LAST STATEMENT RU: %s = %q", c, vals[i].String)
			}
			total += v
		}
	}
	return total, nil
}

// system is the rgserver and rgproxy this run started.
type system struct {
	proxy, proxyStatus string
	procs              []*exec.Cmd
	dir                string
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func startSystem(ctx context.Context, cfg config) (*system, error) {
	dir, err := os.MkdirTemp("", "bench-isolation")
	if err != nil {
		return nil, err
	}
	s := &system{dir: dir}
	addrs := make([]string, 4)
	for i := range addrs {
		if addrs[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	start := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(cfg.BinDir, name), args...)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		s.procs = append(s.procs, cmd)
		return nil
	}
	if err := start("rgserver", "--addr", addrs[0], "--status-addr", addrs[1], "--data-dir", filepath.Join(dir, "rgs"),
		"--log-level", "warn"); err != nil {
		return nil, err
	}
	if err := waitListening(addrs[0]); err != nil {
		err = fmt.Errorf("rgserver: %w\n%s", err, s.log("rgserver"))
		s.stop()
		return nil, err
	}
	s.proxy, s.proxyStatus = addrs[2], addrs[3]
	if err := start("rgproxy", "--listen", s.proxy, "--status-addr", s.proxyStatus, "--backend", cfg.Backend,
		"--token-server", addrs[0], "--cache-dir", filepath.Join(dir, "cache"), "--cpu-source", cfg.CPUSource,
		"--log-level", "warn"); err != nil {
		s.stop()
		return nil, err
	}
	if err := waitListening(s.proxy); err != nil {
		err = fmt.Errorf("rgproxy: %w\n%s", err, s.log("rgproxy"))
		s.stop()
		return nil, err
	}
	return s, nil
}

func waitListening(addr string) error {
	for range 150 {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

// log returns what a process of the system logged.
func (s *system) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	return string(b)
}

func (s *system) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		_ = s.procs[i].Process.Signal(os.Interrupt)
		_ = s.procs[i].Wait()
	}
	os.RemoveAll(s.dir)
}

// cpuSource reads /readyz's cpu_source.
func (s *system) cpuSource() (string, error) {
	resp, err := http.Get("http://" + s.proxyStatus + "/readyz")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var h struct {
		CPUSource string `json:"cpu_source"`
	}
	err = json.NewDecoder(resp.Body).Decode(&h)
	return h.CPUSource, err
}

// groupRU is what the proxy charged group so far (rgproxy_ru_consumed_total).
func (s *system) groupRU(group string) (float64, error) {
	return s.groupMetric("rgproxy_ru_consumed_total", group)
}

// groupWait is how long group's statements waited for tokens so far, in
// seconds (rgproxy_throttle_wait_seconds' sum).
func (s *system) groupWait(group string) (float64, error) {
	return s.groupMetric("rgproxy_throttle_wait_seconds_sum", group)
}

// groupMetric sums the proxy's samples of metric for group.
func (s *system) groupMetric(metric, group string) (float64, error) {
	resp, err := http.Get("http://" + s.proxyStatus + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") || !strings.Contains(line, `resource_group="`+group+`"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, sc.Err()
}

func printReport(w io.Writer, cfg config, rep *Report) {
	fmt.Fprintf(w, "\nnoisy neighbour: victim %d stmt/s on %d threads (default group); aggressor %d sessions in a group of %d RU/s; cpu source %s\n",
		cfg.VictimRate, cfg.VictimThreads, cfg.Aggressors, cfg.RUPerSec, rep.CPUSource)
	fmt.Fprintf(w, "victim p99: %d rounds of %v alone then %v beside the aggressor (after its %v warm-up), each side over all its rounds\n",
		cfg.Rounds, cfg.Phase, cfg.Phase, cfg.Warmup)
	fmt.Fprintf(w, "SELECT SLEEP(1) charged %.3f RU of CPU (runs %.3f)\n\n", rep.SleepCPU, rep.SleepCPURuns)
	fmt.Fprintf(w, "%-6s %28s %28s %32s %26s\n", "", "victim p99 direct (ms)", "victim p99 rgproxy (ms)", "aggressor RU vs R×T+cap", "one statement's RU")
	fmt.Fprintf(w, "%-6s %9s %9s %8s %9s %9s %8s %10s %10s %10s %8s %8s %8s\n", "kind",
		"alone", "beside", "ratio", "alone", "beside", "ratio", "RU", "limit", "over", "alone", "beside", "ratio")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-6s %9.2f %9.2f %7.1fx %9.2f %9.2f %7.2fx %10.0f %10.0f %+9.1f%% %8.1f %8.1f %7.2fx\n", r.Kind,
			r.DirectAloneP99, r.DirectBesideP99, r.DirectRatio, r.ProxyAloneP99, r.ProxyBesideP99, r.ProxyRatio,
			r.AggressorRU, r.AggressorLimit, 100*r.AggressorOver, r.OneAloneRU, r.OneBesideRU, r.OneRatio)
		fmt.Fprintf(w, "       one statement's wall time alone %.0f ms, beside %d direct copies %.0f ms, %.1fx (what wall-time metering would charge); RU ratio by round %.2f\n",
			r.OneAloneWall, cfg.Aggressors, r.OneBesideWall, r.OneWallRatio, r.OneRatioRounds)
		fmt.Fprintf(w, "       aggressor through rgproxy: %d statements, %d errors; victim errors %d\n",
			r.AggressorStatements, r.AggressorErrors, r.VictimErrors)
		fmt.Fprintf(w, "       victim p99 through rgproxy over the continuous %v throttled phase: %.2f ms, %.2fx alone; median of its %v windows: %.2f ms, %.2fx\n",
			cfg.Throttled, r.ThrottledP99, r.ThrottledP99/r.ProxyAloneP99, cfg.Phase, r.ProxyBesideWindowP99, r.ProxyBesideWindowP99/r.ProxyAloneP99)
		fmt.Fprintf(w, "       control: victim through rgproxy beside the statement paced directly at %d RU/s, one at a time: p99 %.2f → %.2f ms, %.2fx\n",
			cfg.RUPerSec, r.PacedAloneP99, r.PacedBesideP99, r.PacedRatio)
	}
}
