// Command soak is `make soak`: rgproxy's long-run test. It starts three
// rgserver replicas (each embedding one etcd member), three rgproxies and
// a private MariaDB of its own, and drives a steady mixed load (reads,
// writes, transactions; prepared and plain) in several resource groups
// for --duration, with periodic group DDL (CREATE, ALTER, DROP RESOURCE
// GROUP, ALTER USER ... RESOURCE GROUP), one SIGKILL of the rgserver
// leader and its restart, one restart of the backend, and sessions idling
// past the backend's short wait_timeout. Time is compressed with
// rgserver's flags (a short --persist-interval and
// --etcd-compaction-retention), so that minutes stand for many hours of
// etcd writes.
//
// It prints a summary and exits non-zero when an assertion fails:
// statement errors other than the expected ones (8252 refusals under
// throttling; 1927 for a statement in flight and 9001 for a new session
// while the backend is down); goroutines, RSS and open fds of every
// process at start and end; etcd's database size and revision at start
// and end, compaction, and the NOSPACE alarm never raised; each limited
// group's consumption (rgserver's and the proxies') against RU_PER_SEC × T
// + capacity; and no series left of a dropped group on any /metrics.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// config is soak's command line.
type config struct {
	Duration            time.Duration
	BinDir              string
	Workers             int
	Rate                float64
	DDLInterval         time.Duration
	WaitTimeout         int
	PersistInterval     time.Duration
	CompactionRetention time.Duration
	QuotaBytes          int64
	MaxWait             time.Duration
	GroupIdleExpiry     time.Duration
	Tolerance           float64
	BudgetDayLength     time.Duration
	Keep                bool
}

// The seeded table: seedRows rows in seedGroups values of grp, so that a
// range aggregate reads a few thousand rows.
const (
	seedRows   = 20000
	seedGroups = 8
)

// limited is a resource group the soak loads and checks against its limit.
type limited struct {
	name     string
	ruPerSec float64
	burst    float64 // capacity in seconds of RU_PER_SEC: 1, or 10 with BURSTABLE
	ddl      string
	sessions int // × --workers; 0 = 1
	// budgetDays is the group's DAY budget in days of RU_PER_SEC (0 =
	// none): spent before each (compressed) day ends, so that its REFUSE
	// (8255) holds for the rest of the day and lifts at the next.
	budgetDays float64
}

// budgetRU is g's DAY budget for a day of length day.
func (g limited) budgetRU(day time.Duration) float64 {
	return math.Round(g.budgetDays * g.ruPerSec * day.Seconds())
}

// soakGroups are the limited groups (all loaded beyond their limit).
// soak_alt's RU_PER_SEC alternates between altLow and altHigh.
var soakGroups = []limited{
	{name: "soak_oltp", ruPerSec: 60, burst: 1, ddl: "CREATE RESOURCE GROUP soak_oltp RU_PER_SEC = 60"},
	{name: "soak_burst", ruPerSec: 40, burst: 10, ddl: "CREATE RESOURCE GROUP soak_burst RU_PER_SEC = 40 BURSTABLE"},
	{name: "soak_low", ruPerSec: 30, burst: 1, ddl: "CREATE RESOURCE GROUP soak_low RU_PER_SEC = 30 PRIORITY = LOW"},
	{name: "soak_alt", ruPerSec: altLow, burst: 1, ddl: fmt.Sprintf("CREATE RESOURCE GROUP soak_alt RU_PER_SEC = %d", altLow)},
	// Many sessions for a small rate: statements queue beyond --max-wait
	// and some are refused with 8252.
	{name: "soak_tiny", ruPerSec: 10, burst: 1, ddl: "CREATE RESOURCE GROUP soak_tiny RU_PER_SEC = 10", sessions: 4},
	// A daily budget of 3/4 of a day at its rate: refused (8255) for the
	// day's last quarter, shorter than wait_timeout; its DDL is written
	// in setup, with the day's length.
	{name: "soak_budget", ruPerSec: 40, burst: 1, budgetDays: 0.75},
}

const (
	altLow, altHigh = 25, 75
	tmpRUPerSec     = 50
)

func main() {
	cfg, err := parseArgs(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	// go-sql-driver logs every stale pooled connection it replaces: the
	// soak makes many on purpose (wait_timeout, the backend restart).
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed, err := run(ctx, cfg, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

func parseArgs(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long the load runs")
	fs.StringVar(&cfg.BinDir, "bin-dir", "bin", "`directory` holding rgproxy and rgserver")
	fs.IntVar(&cfg.Workers, "workers", 2, "sessions per resource group")
	fs.Float64Var(&cfg.Rate, "rate", 25, "statements (or transactions) per second per session")
	fs.DurationVar(&cfg.DDLInterval, "ddl-interval", 15*time.Second, "period of the resource-group DDL")
	// 30 s stands for MariaDB's 8 h. Much shorter, and the many-session
	// group's runs of refusals (95 % of its statements) outlast it by
	// chance: a session whose statements are all refused sends nothing to
	// its backend, which then closes it (reported apart, and a failure).
	fs.IntVar(&cfg.WaitTimeout, "wait-timeout", 30, "the private MariaDB's wait_timeout, in seconds")
	fs.DurationVar(&cfg.PersistInterval, "persist-interval", 50*time.Millisecond, "rgserver's --persist-interval (rgserver's own default: 5s)")
	fs.DurationVar(&cfg.CompactionRetention, "etcd-compaction-retention", time.Minute, "rgserver's --etcd-compaction-retention (rgserver's own default: 1h)")
	fs.Int64Var(&cfg.QuotaBytes, "etcd-quota-backend-bytes", 64<<20, "rgserver's --etcd-quota-backend-bytes (rgserver's own default: 8 GiB)")
	fs.DurationVar(&cfg.MaxWait, "max-wait", time.Second, "rgproxy's --max-wait")
	fs.DurationVar(&cfg.GroupIdleExpiry, "group-idle-expiry", time.Minute, "rgproxy's --group-idle-expiry (rgproxy's own default: 1h)")
	fs.Float64Var(&cfg.Tolerance, "tolerance", 0.05, "a group may consume this fraction above RU_PER_SEC × T + capacity (debt still unpaid at the end)")
	fs.DurationVar(&cfg.BudgetDayLength, "budget-day-length", time.Minute, "rgserver's --budget-day-length: soak_budget's DAY budget rolls over this often (rgserver's own default: a real day)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the data directories and logs (kept anyway when an assertion fails)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.Duration < 30*time.Second {
		return cfg, errors.New("--duration must be at least 30s")
	}
	if cfg.Workers <= 0 || cfg.Rate <= 0 || cfg.WaitTimeout <= 0 || cfg.DDLInterval <= 0 {
		return cfg, errors.New("--workers, --rate, --wait-timeout and --ddl-interval must be > 0")
	}
	return cfg, nil
}

// report is what the summary prints.
type report struct {
	cfg         config
	dir         string
	loadTime    time.Duration
	statements  map[string]int64
	errs        []errKind
	idle        *idleStats
	ddlOK       int64
	ddlCycles   int
	events      []string
	procs       []procRow
	etcdStart   []etcdRow
	etcdEnd     []etcdRow
	compacted   string
	nospace     bool
	alarms      string
	consumption []consRow
	leftSeries  []string
	logs        []logRow
	failures    []string
}

// logRow counts a process's log lines by level.
type logRow struct {
	name               string
	warn, errs, panics int
}

// scanLogs counts the WARN and ERROR lines and panics in rgserver's and
// rgproxy's logs.
func scanLogs(sys *system) []logRow {
	var out []logRow
	for _, p := range append(append([]*proc{}, sys.rgs...), sys.pxs...) {
		r := logRow{name: p.name}
		data, err := os.ReadFile(p.logPath)
		if err != nil {
			r.errs = -1
		}
		for _, line := range strings.Split(string(data), "\n") {
			switch {
			case strings.Contains(line, "level=WARN"):
				r.warn++
			case strings.Contains(line, "level=ERROR"):
				r.errs++
			case strings.HasPrefix(line, "panic:"), strings.HasPrefix(line, "fatal error:"):
				r.panics++
			}
		}
		out = append(out, r)
	}
	return out
}

type procRow struct {
	name       string
	start, end procStats
	restarted  bool
}

type etcdRow struct {
	member             string
	dbSize, dbInUse    int64
	revision, raftTerm int64
	err                string
}

type consRow struct {
	group            string
	limit            float64
	server, proxies  float64
	statements       int64
	refused          int64
	budgetRefused    int64 // 8255
	longestRefusal   time.Duration
	sessionMin       int64
	sessionMax       int64
	spread           string // sessions' statements by proxy, when uneven
	serverPct, pxPct float64
}

func (r *report) fail(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// run runs the soak; failed reports a failed assertion, err a soak that
// could not run. The processes' logs are kept when either is set.
func run(ctx context.Context, cfg config, out, logw io.Writer) (failed bool, err error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(logw, "%s soak: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	rep := &report{cfg: cfg, idle: &idleStats{}}
	sys, err := startSystem(ctx, cfg, logf)
	if sys != nil {
		rep.dir = sys.dir
		defer func() {
			keep := cfg.Keep || failed || err != nil
			sys.stop(keep)
			if keep {
				fmt.Fprintf(logw, "soak: logs and data kept under %s\n", sys.dir)
			}
		}()
	}
	if err != nil {
		return false, err
	}
	if err := setup(ctx, sys, cfg.BudgetDayLength, logf); err != nil {
		return false, err
	}

	// Start: processes and etcd before the load.
	time.Sleep(2 * time.Second)
	startStats := map[string]procStats{}
	for _, p := range sys.allProcs() {
		st, err := statsOf(p)
		if err != nil {
			return false, err
		}
		startStats[p.name] = st
	}
	ecli, err := newEtcdClient(sys)
	if err != nil {
		return false, err
	}
	defer func() { ecli.Close() }()
	rep.etcdStart = etcdStatus(ctx, sys)
	startRev := int64(0)
	for _, r := range rep.etcdStart {
		startRev = max(startRev, r.revision)
	}

	mon := newMonitor(sys)
	if err := mon.poll(); err != nil {
		return false, err
	}
	monCtx, monStop := context.WithCancel(ctx)
	var monWG sync.WaitGroup
	monWG.Add(1)
	go func() { defer monWG.Done(); mon.run(monCtx, 2*time.Second) }()

	// The load.
	loadStart := time.Now()
	t := newTally(loadStart)
	loadCtx, loadStop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	loads := []groupLoad{{group: "default", user: "soak_default"}, {group: "soak_tmp", user: "soak_tmp"}}
	for _, g := range soakGroups {
		loads = append(loads, groupLoad{group: g.name, user: "u_" + g.name, sessions: g.sessions})
	}
	id := 0
	for _, gl := range loads {
		for range cfg.Workers * max(gl.sessions, 1) {
			addr := sys.pxAddr[id%len(sys.pxAddr)]
			wg.Add(1)
			go func(id int, gl groupLoad) {
				defer wg.Done()
				worker(loadCtx, id, gl, addr, cfg.Rate, time.Duration(cfg.WaitTimeout)*time.Second, t)
			}(id, gl)
			id++
		}
	}
	for i, addr := range sys.pxAddr {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idler(loadCtx, i, addr, time.Duration(cfg.WaitTimeout)*time.Second+2*time.Second, t, rep.idle)
		}()
	}
	ddl := newDDL(sys)
	wg.Add(1)
	go func() { defer wg.Done(); ddl.run(loadCtx, cfg.DDLInterval, t) }()
	logf("load running for %v: %d sessions in %d groups, %d idle sessions, DDL every %v", cfg.Duration,
		id, len(loads), len(sys.pxAddr), cfg.DDLInterval)

	// The events: the rgserver leader killed at 30 %, the backend
	// restarted at 60 %.
	events := []struct {
		at time.Duration
		do func() error
	}{
		{cfg.Duration * 3 / 10, func() error { return killLeader(sys, rep, logf, loadStart) }},
		{cfg.Duration * 6 / 10, func() error { return restartBackend(sys, rep, t, logf, loadStart) }},
	}
	for _, ev := range events {
		if !sleepUntil(ctx, loadStart.Add(ev.at)) {
			break
		}
		if err := ev.do(); err != nil {
			rep.fail("%v", err)
			logf("event failed: %v", err)
		}
	}
	sleepUntil(ctx, loadStart.Add(cfg.Duration))
	loadStop()
	wg.Wait()
	rep.loadTime = time.Since(loadStart)
	logf("load stopped after %v; letting the last reports arrive", rep.loadTime.Round(time.Second))
	// Final consumption reports (every 5 s), sessions closed.
	time.Sleep(8 * time.Second)
	monStop()
	monWG.Wait()
	if err := mon.poll(); err != nil {
		rep.fail("final scrape: %v", err)
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}

	// End.
	for _, p := range sys.allProcs() {
		st, err := statsOf(p)
		if err != nil {
			rep.fail("%s at the end: %v", p.name, err)
			continue
		}
		rep.procs = append(rep.procs, procRow{name: p.name, start: startStats[p.name], end: st, restarted: p.restarts > 0})
	}
	ecli.Close()
	if ecli, err = newEtcdClient(sys); err != nil { // a restarted member has a new client URL
		return false, err
	}
	rep.etcdEnd = etcdStatus(ctx, sys)
	rep.compacted = compactedSince(ctx, ecli, startRev)
	if al, err := ecli.AlarmList(ctx); err != nil {
		rep.fail("etcd alarm list: %v", err)
	} else {
		var as []string
		for _, a := range al.Alarms {
			as = append(as, a.Alarm.String())
		}
		rep.alarms = strings.Join(as, ",")
		if rep.alarms != "" {
			rep.fail("etcd alarms raised: %s", rep.alarms)
		}
	}
	rep.nospace = mon.nospace
	rep.logs = scanLogs(sys)
	rep.statements = t.ok
	rep.errs = t.kindsSorted()
	rep.ddlOK, rep.ddlCycles = ddl.ok.Load(), ddl.cycles
	judge(rep, sys, mon, ddl, t)
	printReport(out, rep)
	return len(rep.failures) > 0, nil
}

func (s *system) allProcs() []*proc {
	out := []*proc{s.maria}
	out = append(out, s.rgs...)
	return append(out, s.pxs...)
}

// sleepUntil waits until at; false when ctx ended first.
func sleepUntil(ctx context.Context, at time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(at)):
		return true
	}
}

// setup creates the schema and the users on the private server, and the
// groups and bindings through a proxy.
func setup(ctx context.Context, sys *system, day time.Duration, logf func(string, ...any)) error {
	root, err := sql.Open("mysql", dsn(sys.mariaAdr, "root", "", ""))
	if err != nil {
		return err
	}
	defer root.Close()
	stmts := []string{
		"CREATE DATABASE soak",
		"CREATE TABLE soak.kv (id BIGINT AUTO_INCREMENT PRIMARY KEY, grp INT NOT NULL, v INT NOT NULL, pad VARCHAR(200) NOT NULL DEFAULT '', KEY (grp))",
		fmt.Sprintf("INSERT INTO soak.kv (grp, v, pad) SELECT seq %% %d, seq, REPEAT('p', 50) FROM soak.seq_1_to_%d", seedGroups, seedRows),
	}
	users := []string{"soak_default", "soak_tmp", "soak_idle"}
	for _, g := range soakGroups {
		users = append(users, "u_"+g.name)
	}
	for _, u := range users {
		stmts = append(stmts, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'soakpw'", u),
			fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON soak.* TO '%s'@'%%'", u))
	}
	for _, q := range stmts {
		if _, err := root.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	admin, err := sql.Open("mysql", dsn(sys.pxAddr[0], "root", "", ""))
	if err != nil {
		return err
	}
	defer admin.Close()
	stmts = []string{fmt.Sprintf("CREATE RESOURCE GROUP soak_tmp_0 RU_PER_SEC = %d", tmpRUPerSec),
		"ALTER USER 'soak_tmp'@'%' RESOURCE GROUP soak_tmp_0"}
	for _, g := range soakGroups {
		ddl := g.ddl
		if g.budgetDays > 0 {
			ddl = fmt.Sprintf("CREATE RESOURCE GROUP %s RU_PER_SEC = %.0f BUDGET = (RU = %.0f PER DAY, ON 50 PERCENT NOTIFY, ON 100 PERCENT REFUSE)",
				g.name, g.ruPerSec, g.budgetRU(day))
		}
		stmts = append(stmts, ddl, fmt.Sprintf("ALTER USER 'u_%s'@'%%' RESOURCE GROUP %s", g.name, g.name))
	}
	for _, q := range stmts {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	logf("schema (%d rows), %d users, %d groups ready", seedRows, len(users), len(soakGroups)+1)
	time.Sleep(time.Second) // the bindings reach every proxy
	return nil
}

// killLeader SIGKILLs the rgserver leader, waits for another to lead, and
// restarts the killed one 10 s later.
func killLeader(sys *system, rep *report, logf func(string, ...any), start time.Time) error {
	i, err := sys.leader(15 * time.Second)
	if err != nil {
		return err
	}
	p := sys.rgs[i]
	killed := time.Now()
	if err := p.cmd.Process.Kill(); err != nil {
		return err
	}
	<-p.done
	j, err := sys.leader(30 * time.Second)
	if err != nil {
		return fmt.Errorf("after killing %s: %w", p.name, err)
	}
	took := time.Since(killed)
	rep.events = append(rep.events, fmt.Sprintf("%6.0fs  rgserver leader %s SIGKILLed; %s leads %v later",
		killed.Sub(start).Seconds(), p.name, sys.rgs[j].name, took.Round(time.Millisecond)))
	logf("leader %s killed; %s leads after %v", p.name, sys.rgs[j].name, took.Round(time.Millisecond))
	if took > 5*time.Second {
		rep.fail("a new rgserver leader took %v (want ≤ 5 s)", took)
	}
	time.Sleep(10 * time.Second)
	if err := p.start(); err != nil {
		return err
	}
	if err := waitReady(p, 60*time.Second); err != nil {
		return err
	}
	rep.events = append(rep.events, fmt.Sprintf("%6.0fs  %s restarted and ready", time.Since(start).Seconds(), p.name))
	logf("%s restarted", p.name)
	return nil
}

// restartBackend stops the private MariaDB (SIGTERM), keeps it down 5 s
// and starts it again. The outage, and 5 s after it, is the window in
// which 1927 and 9001 are expected.
func restartBackend(sys *system, rep *report, t *tally, logf func(string, ...any), start time.Time) error {
	down := time.Now()
	t.addWindow(window{from: down})
	sys.maria.stop(syscall.SIGTERM, 60*time.Second)
	stopped := time.Now()
	time.Sleep(5 * time.Second)
	if err := sys.maria.start(); err != nil {
		return err
	}
	if err := sys.waitMaria(60 * time.Second); err != nil {
		return err
	}
	up := time.Now()
	t.closeWindow(up.Add(5 * time.Second))
	rep.events = append(rep.events, fmt.Sprintf("%6.0fs  backend stopped (SIGTERM, %v to exit), restarted, serving %v after the stop",
		down.Sub(start).Seconds(), stopped.Sub(down).Round(time.Millisecond), up.Sub(down).Round(time.Millisecond)))
	logf("backend restarted (down %v)", up.Sub(down).Round(time.Millisecond))
	return nil
}

// newEtcdClient connects to every embedded member's client URL.
func newEtcdClient(sys *system) (*clientv3.Client, error) {
	var eps []string
	for i, p := range sys.rgs {
		u, err := etcdClientURL(p, sys.rgsAddr[i], p.status, sys.rgsPeer[i])
		if err != nil {
			return nil, err
		}
		eps = append(eps, u)
	}
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// etcdStatus asks each member for its database size and revision.
func etcdStatus(ctx context.Context, sys *system) []etcdRow {
	var rows []etcdRow
	for i, p := range sys.rgs {
		r := etcdRow{member: p.name}
		u, err := etcdClientURL(p, sys.rgsAddr[i], p.status, sys.rgsPeer[i])
		if err == nil {
			var cli *clientv3.Client
			cli, err = clientv3.New(clientv3.Config{Endpoints: []string{u}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err == nil {
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				st, serr := cli.Status(sctx, u)
				cancel()
				cli.Close()
				err = serr
				if serr == nil {
					r.dbSize, r.dbInUse, r.revision, r.raftTerm = st.DbSize, st.DbSizeInUse, st.Header.GetRevision(), int64(st.RaftTerm)
				}
			}
		}
		if err != nil {
			r.err = err.Error()
		}
		rows = append(rows, r)
	}
	return rows
}

// compactedSince says whether etcd compacted its history past rev.
func compactedSince(ctx context.Context, cli *clientv3.Client, rev int64) string {
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := cli.Get(gctx, "/rg/", clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCountOnly())
	switch {
	case err == nil:
		return fmt.Sprintf("no: revision %d still readable", rev)
	case strings.Contains(err.Error(), "compacted"):
		return fmt.Sprintf("yes: revision %d (the start's) compacted away", rev)
	}
	return "unknown: " + err.Error()
}

// judge turns the figures into assertions.
func judge(rep *report, sys *system, mon *monitor, ddl *ddlLoop, t *tally) {
	for _, e := range rep.errs {
		if !e.Expected {
			rep.fail("unexpected errors %q: %d (%d outside the backend outage), first at %v: %s",
				e.Kind, e.Count, e.Outside, e.FirstAt.Round(time.Second), e.First)
		}
	}
	if rep.idle.resumed.Load() == 0 {
		rep.fail("no idle session was used again after wait_timeout")
	}
	if rep.ddlCycles == 0 {
		rep.fail("no DDL cycle ran")
	}
	if rep.nospace {
		rep.fail("etcd NOSPACE raised (rgserver_etcd_degraded{reason=\"nospace\"})")
	}
	if !strings.HasPrefix(rep.compacted, "yes") && rep.cfg.Duration > 3*rep.cfg.CompactionRetention {
		rep.fail("etcd never compacted: %s", rep.compacted)
	}
	for _, r := range rep.etcdEnd {
		if r.err != "" {
			rep.fail("etcd member %s: %s", r.member, r.err)
		}
		if r.dbSize > rep.cfg.QuotaBytes/2 {
			rep.fail("etcd member %s: database %d bytes, more than half the quota", r.member, r.dbSize)
		}
	}
	for _, pr := range rep.procs {
		if pr.restarted || pr.name == "mariadbd" {
			continue
		}
		if d := pr.end.Goroutines - pr.start.Goroutines; d > math.Max(50, pr.start.Goroutines/4) {
			rep.fail("%s: goroutines %v → %v", pr.name, pr.start.Goroutines, pr.end.Goroutines)
		}
		if d := pr.end.FDs - pr.start.FDs; d > max(20, pr.start.FDs/4) {
			rep.fail("%s: open fds %d → %d", pr.name, pr.start.FDs, pr.end.FDs)
		}
	}
	// Consumption against the limit.
	for _, g := range soakGroups {
		limit := g.ruPerSec*rep.loadTime.Seconds() + g.ruPerSec*g.burst
		if g.name == "soak_alt" {
			limit = ddl.altLimit(mon.startAt, mon.startAt.Add(rep.loadTime))
		}
		if g.budgetDays > 0 {
			limit = min(limit, budgetLimit(g, rep.cfg.BudgetDayLength, mon.startAt, mon.startAt.Add(rep.loadTime)))
			if n := t.budgetRefused[g.name]; n == 0 {
				rep.fail("%s: no statement was refused by its budget (8255)", g.name)
			}
		}
		row := consRow{group: g.name, limit: limit, server: mon.serverRU[g.name], statements: t.ok[g.name],
			proxies: mon.proxyRU[g.name]}
		row.refused, row.budgetRefused, row.longestRefusal = t.refused[g.name], t.budgetRefused[g.name], t.longestRefusal[g.name]
		row.sessionMin, row.sessionMax = t.sessionSpread(g.name)
		if row.sessionMin*4 < row.sessionMax {
			// Uneven: which proxy each session used, and what it ran.
			byProxy := map[int][]string{}
			for id, n := range t.sessions(g.name) {
				byProxy[id%len(sys.pxAddr)] = append(byProxy[id%len(sys.pxAddr)], strconv.FormatInt(n, 10))
			}
			var parts []string
			for i, px := range sys.pxs {
				sort.Strings(byProxy[i])
				parts = append(parts, fmt.Sprintf("%s [%s]", px.name, strings.Join(byProxy[i], " ")))
			}
			row.spread = strings.Join(parts, ", ")
		}
		row.serverPct, row.pxPct = 100*row.server/limit, 100*row.proxies/limit
		rep.consumption = append(rep.consumption, row)
		for _, v := range []struct {
			who string
			ru  float64
		}{{"rgserver", row.server}, {"the proxies", row.proxies}} {
			if v.ru > limit*(1+rep.cfg.Tolerance) {
				rep.fail("%s: %s report %.1f RU, above RU_PER_SEC × T + capacity = %.1f (+%.0f%% allowed)",
					g.name, v.who, v.ru, limit, 100*rep.cfg.Tolerance)
			}
			// Every group's demand exceeds its limit: far below it means
			// statements were held back for nothing.
			if v.ru < limit/2 {
				rep.fail("%s: %s report %.1f RU, less than half of RU_PER_SEC × T + capacity = %.1f", g.name, v.who, v.ru, limit)
			}
		}
	}
	// No series left of a dropped group.
	for _, p := range append(append([]*proc{}, sys.pxs...), sys.rgs...) {
		fams, err := scrape(p.status)
		if err != nil {
			rep.fail("%s /metrics: %v", p.name, err)
			continue
		}
		for g := range groupsWithSeries(fams) {
			if ddl.wasDropped(g) {
				rep.leftSeries = append(rep.leftSeries, p.name+": "+g)
			}
		}
	}
	for _, l := range rep.logs {
		if l.panics > 0 {
			rep.fail("%s panicked (log %s)", l.name, sys.dir)
		}
	}
	sort.Strings(rep.leftSeries)
	if len(rep.leftSeries) > 0 {
		rep.fail("series of dropped groups remain: %s", strings.Join(rep.leftSeries, ", "))
	}
}

// budgetLimit is what g may spend from from to to under its DAY budget:
// the budget of every day the span touches (rgserver's compressed days
// start at multiples of day since the epoch), plus what reaches the
// backend between a crossing and the proxies hearing of it (a report
// every 250 ms, the push; 2 s at RU_PER_SEC a day) and what the leader
// kill may lose (the usage history's last 10 s, which seed the new
// term's budgets).
func budgetLimit(g limited, day time.Duration, from, to time.Time) float64 {
	days := to.UnixNano()/int64(day) - from.UnixNano()/int64(day) + 1
	return float64(days)*(g.budgetRU(day)+2*g.ruPerSec) + 10*g.ruPerSec
}

func printReport(w io.Writer, rep *report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	cfg := rep.cfg
	p("")
	p("== rgproxy soak: %v of load (rgserver ×3 with embedded etcd, rgproxy ×3, private MariaDB) ==", rep.loadTime.Round(time.Second))
	p("time compression: --persist-interval %v (default 5s: ×%.0f), --etcd-compaction-retention %v (default 1h), quota %d MiB; wait_timeout %ds; --max-wait %v; --group-idle-expiry %v",
		cfg.PersistInterval, float64(5*time.Second)/float64(cfg.PersistInterval), cfg.CompactionRetention, cfg.QuotaBytes>>20,
		cfg.WaitTimeout, cfg.MaxWait, cfg.GroupIdleExpiry)
	p("")
	p("events:")
	for _, e := range rep.events {
		p("  %s", e)
	}
	p("")
	p("statements that succeeded, by group:")
	var groups []string
	var total int64
	for g, n := range rep.statements {
		groups = append(groups, g)
		total += n
	}
	sort.Strings(groups)
	for _, g := range groups {
		p("  %-12s %9d", g, rep.statements[g])
	}
	p("  %-12s %9d  (%.0f/s)", "total", total, float64(total)/rep.loadTime.Seconds())
	p("idle sessions: %d uses after idling past wait_timeout succeeded, %d failed", rep.idle.resumed.Load(), rep.idle.failed.Load())
	p("DDL: %d cycles, %d statements succeeded", rep.ddlCycles, rep.ddlOK)
	p("")
	p("errors by kind (expected: 8252 any time; 8255 of a group with a budget; 1927, 9001 and a driver's \"invalid connection\" only during the backend outage and 5 s after):")
	if len(rep.errs) == 0 {
		p("  none")
	}
	for _, e := range rep.errs {
		verdict := "UNEXPECTED"
		if e.Expected {
			verdict = "expected"
		}
		p("  %-40s %7d  %-10s first at %4.0fs: %s", e.Kind, e.Count, verdict, e.FirstAt.Seconds(), truncate(e.First, 90))
	}
	p("")
	p("processes (start = before the load, end = after it, sessions closed):")
	p("  %-9s %9s %9s %9s %9s %7s %7s %11s %11s", "process", "RSS start", "RSS end", "thr start", "thr end", "fds st", "fds end", "gorout. st", "gorout. end")
	for _, pr := range rep.procs {
		note := ""
		if pr.restarted {
			note = "  (restarted: end is the new process)"
		}
		p("  %-9s %8.1fM %8.1fM %9d %9d %7d %7d %11s %11s%s", pr.name, float64(pr.start.RSSKiB)/1024, float64(pr.end.RSSKiB)/1024,
			pr.start.Threads, pr.end.Threads, pr.start.FDs, pr.end.FDs, gor(pr.start.Goroutines), gor(pr.end.Goroutines), note)
	}
	p("")
	p("etcd (per member: database size / in use, revision):")
	for i := range rep.etcdEnd {
		s, e := etcdRow{}, rep.etcdEnd[i]
		if i < len(rep.etcdStart) {
			s = rep.etcdStart[i]
		}
		p("  %-5s start %7.1f KiB / %7.1f KiB rev %7d   end %7.1f KiB / %7.1f KiB rev %7d %s", e.member,
			float64(s.dbSize)/1024, float64(s.dbInUse)/1024, s.revision, float64(e.dbSize)/1024, float64(e.dbInUse)/1024, e.revision, e.err)
	}
	if len(rep.etcdEnd) > 0 && len(rep.etcdStart) > 0 && rep.loadTime > 0 {
		p("  revisions per minute: %.0f", float64(rep.etcdEnd[0].revision-rep.etcdStart[0].revision)/rep.loadTime.Minutes())
	}
	p("  compacted: %s", rep.compacted)
	p("  NOSPACE raised: %v; alarms at the end: %q", rep.nospace, rep.alarms)
	p("")
	p("consumption against RU_PER_SEC × T + capacity (T = %v; a budget's group: at most its DAY budget a day, %v days):",
		rep.loadTime.Round(time.Second), cfg.BudgetDayLength)
	p("  %-11s %10s %12s %7s %12s %7s %10s %8s %8s %13s %s", "group", "limit RU", "rgserver RU", "%", "proxies RU", "%", "statements",
		"8252s", "8255s", "per session", "longest run of refusals of one session")
	for _, c := range rep.consumption {
		p("  %-11s %10.1f %12.1f %6.1f%% %12.1f %6.1f%% %10d %8d %8d %6d-%-6d %6.1fs", c.group, c.limit, c.server, c.serverPct, c.proxies, c.pxPct,
			c.statements, c.refused, c.budgetRefused, c.sessionMin, c.sessionMax, c.longestRefusal.Seconds())
	}
	for _, c := range rep.consumption {
		if c.spread != "" {
			p("  %s: statements of each session, by proxy: %s", c.group, c.spread)
		}
	}
	p("dropped groups' series left on any /metrics: %d", len(rep.leftSeries))
	p("")
	p("log lines (rgserver, rgproxy; WARN includes logins refused while the backend was down):")
	for _, l := range rep.logs {
		p("  %-9s WARN %5d  ERROR %3d  panics %d", l.name, l.warn, l.errs, l.panics)
	}
	p("")
	if len(rep.failures) == 0 {
		p("PASS: every assertion held")
		return
	}
	p("FAIL: %d assertions failed (logs kept under %s):", len(rep.failures), rep.dir)
	for _, f := range rep.failures {
		p("  - %s", f)
	}
}

func gor(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
