// Command demo-load drives a closed-loop load through rgproxy as several
// users at once, so that the walkthrough in README.md can show one resource
// group throttled while another is not. Every interval it prints, per user,
// the statements per second that ran and the statements per second refused
// with 8252 (resource group quota exceeded).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rgproxy/rgproxy/internal/clock"
)

// errThrottledCode is TiDB's (and rgproxy's) "Exceeded resource group
// quota limitation".
const errThrottledCode = 8252

// ErrUsage marks a bad command line.
var ErrUsage = errors.New("demo-load: usage")

// account is one user the load logs in as.
type account struct {
	Name, Password string
}

// config is demo-load's command line.
type config struct {
	// Addr is rgproxy's MySQL address (host:port); default 127.0.0.1:4000.
	Addr string
	// Accounts are the users to log in as; default app_a and app_b.
	Accounts []account
	// Clients is the number of sessions per user; default 4.
	Clients int
	// Query is the statement every session runs in a loop; default
	// "SELECT BENCHMARK(150000, SHA1('rgproxy'))" (about 4 RU: 0.625 base + about 10 ms of CPU).
	Query string
	// Duration is how long the load runs; 0 = until Ctrl-C. Default 0.
	Duration time.Duration
	// Interval is how often a line of rates is printed; default 1 s.
	Interval time.Duration
	// Backoff is the pause after a failed statement before the session
	// retries, as an application backs off on 8252; default 20 ms.
	Backoff time.Duration
}

// parseAccounts parses "name[:password],..." ; users without a password
// get def. Names must be non-empty and distinct.
func parseAccounts(s, def string) ([]account, error) {
	var out []account
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, pw, ok := strings.Cut(f, ":")
		if !ok {
			pw = def
		}
		if name == "" {
			return nil, fmt.Errorf("%w: --users: empty user name in %q", ErrUsage, f)
		}
		if seen[name] {
			return nil, fmt.Errorf("%w: --users: %s given twice", ErrUsage, name)
		}
		seen[name] = true
		out = append(out, account{Name: name, Password: pw})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --users: no user", ErrUsage)
	}
	return out, nil
}

func parseArgs(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("demo-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:4000", "rgproxy's MySQL `address`")
	users := fs.String("users", "app_a,app_b", "users to log in as, comma-separated, each `name[:password]`")
	password := fs.String("password", "apppw", "password of the users given without one")
	fs.IntVar(&cfg.Clients, "clients", 4, "sessions per user")
	fs.StringVar(&cfg.Query, "query", "SELECT BENCHMARK(150000, SHA1('rgproxy'))", "statement every session runs in a loop")
	fs.DurationVar(&cfg.Duration, "duration", 0, "how long to run; 0 = until Ctrl-C")
	fs.DurationVar(&cfg.Interval, "interval", time.Second, "how often to print rates")
	fs.DurationVar(&cfg.Backoff, "backoff", 20*time.Millisecond, "pause after a failed statement")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	var err error
	if cfg.Accounts, err = parseAccounts(*users, *password); err != nil {
		return cfg, err
	}
	switch {
	case cfg.Clients < 1:
		return cfg, fmt.Errorf("%w: --clients must be at least 1", ErrUsage)
	case cfg.Interval <= 0:
		return cfg, fmt.Errorf("%w: --interval must be positive", ErrUsage)
	case cfg.Duration < 0 || cfg.Backoff < 0:
		return cfg, fmt.Errorf("%w: negative --duration or --backoff", ErrUsage)
	case strings.TrimSpace(cfg.Query) == "":
		return cfg, fmt.Errorf("%w: empty --query", ErrUsage)
	}
	return cfg, nil
}

// counts are what one user's sessions did so far.
type counts struct {
	OK, Throttled, Failed int64
}

// userLoad is one user's counters, shared by its sessions.
type userLoad struct {
	name                  string
	ok, throttled, failed atomic.Int64
	firstErr              sync.Once
}

func (u *userLoad) snapshot() counts {
	return counts{OK: u.ok.Load(), Throttled: u.throttled.Load(), Failed: u.failed.Load()}
}

// isThrottled reports whether err is rgproxy's 8252.
func isThrottled(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errThrottledCode
}

// rateLine formats one interval: per user, statements/s that ran,
// refused (8252) and failed otherwise.
func rateLine(elapsed time.Duration, names []string, prev, cur []counts, dt time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%6.1fs", elapsed.Seconds())
	sec := dt.Seconds()
	for i, n := range names {
		d := counts{cur[i].OK - prev[i].OK, cur[i].Throttled - prev[i].Throttled, cur[i].Failed - prev[i].Failed}
		fmt.Fprintf(&b, "  %s: %7.1f ok/s %7.1f throttled/s", n, float64(d.OK)/sec, float64(d.Throttled)/sec)
		if d.Failed > 0 {
			fmt.Fprintf(&b, " %5.1f failed/s", float64(d.Failed)/sec)
		}
	}
	return b.String()
}

// session runs cfg.Query on one connection until ctx ends.
func session(ctx context.Context, db *sql.DB, cfg config, u *userLoad, log *slog.Logger) {
	pause := func() {
		t := time.NewTimer(cfg.Backoff)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	for ctx.Err() == nil {
		conn, err := db.Conn(ctx)
		if err != nil {
			if ctx.Err() == nil {
				u.failed.Add(1)
				u.firstErr.Do(func() { log.Warn("connect failed", "user", u.name, "err", err) })
				pause()
			}
			continue
		}
		for ctx.Err() == nil {
			// Not ctx: a statement running when the load ends finishes
			// rather than being killed.
			_, err := conn.ExecContext(context.Background(), cfg.Query)
			switch {
			case err == nil:
				u.ok.Add(1)
				continue
			case isThrottled(err):
				u.throttled.Add(1)
			default:
				u.failed.Add(1)
				u.firstErr.Do(func() { log.Warn("statement failed", "user", u.name, "err", err) })
			}
			pause()
			if !isThrottled(err) {
				break // a fresh connection, in case this one is broken
			}
		}
		conn.Close()
	}
}

// load is one run's users: a connection pool and counters for each.
type load struct {
	cfg   config
	users []*userLoad
	names []string
	dbs   []*sql.DB
}

// open connects as each user, failing at once on a wrong address or
// password rather than once per session. close releases the pools.
func open(ctx context.Context, cfg config) (*load, error) {
	l := &load{cfg: cfg}
	for _, a := range cfg.Accounts {
		mc := mysql.NewConfig()
		mc.User, mc.Passwd, mc.Net, mc.Addr = a.Name, a.Password, "tcp", cfg.Addr
		mc.Timeout = 5 * time.Second
		connector, err := mysql.NewConnector(mc)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("user %s: %w", a.Name, err)
		}
		db := sql.OpenDB(connector)
		db.SetMaxOpenConns(cfg.Clients)
		db.SetMaxIdleConns(cfg.Clients)
		l.dbs = append(l.dbs, db)
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		err = db.PingContext(pctx)
		pcancel()
		if err != nil {
			l.close()
			return nil, fmt.Errorf("user %s at %s: %w (create the users first: see README, Walkthrough)", a.Name, cfg.Addr, err)
		}
		l.users, l.names = append(l.users, &userLoad{name: a.Name}), append(l.names, a.Name)
	}
	return l, nil
}

func (l *load) close() {
	for _, db := range l.dbs {
		db.Close()
	}
}

func (l *load) snap() []counts {
	s := make([]counts, len(l.users))
	for i, u := range l.users {
		s[i] = u.snapshot()
	}
	return s
}

// run drives the load until ctx ends or cfg.Duration has passed on clk,
// printing a rate line every cfg.Interval and totals at the end. The
// duration counts from when the sessions start (logging in is not part of
// it), and its end is a tick of its own: a 3 s run at 1 s intervals prints
// three lines however slowly the machine runs; Ctrl-C prints none for the
// interval it cuts short.
func (l *load) run(ctx context.Context, clk clock.Clock, out io.Writer, log *slog.Logger) []counts {
	cfg := l.cfg
	fmt.Fprintf(out, "demo-load: %d sessions per user (%s) through %s running %q; Ctrl-C stops\n",
		cfg.Clients, strings.Join(l.names, ", "), cfg.Addr, cfg.Query)
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, u := range l.users {
		for range cfg.Clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				session(sctx, l.dbs[i], cfg, u, log)
			}()
		}
	}
	start := clk.Now()
	end := start.Add(cfg.Duration)
	prev, prevAt := l.snap(), start
	for k := 1; ; k++ {
		at := start.Add(time.Duration(k) * cfg.Interval)
		last := cfg.Duration > 0 && !at.Before(end)
		if last {
			at = end
		}
		t := clk.NewTimer(at.Sub(clk.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			last = true
		case now := <-t.C():
			cur := l.snap()
			fmt.Fprintln(out, rateLine(now.Sub(start), l.names, prev, cur, now.Sub(prevAt)))
			prev, prevAt = cur, now
		}
		if last {
			break
		}
	}
	stop()
	wg.Wait()
	total := l.snap()
	took := clk.Now().Sub(start)
	fmt.Fprintln(out, "total:", rateLine(took, l.names, make([]counts, len(l.users)), total, took))
	return total
}

// run connects as every user and drives the load (load.run).
func run(ctx context.Context, cfg config, clk clock.Clock, out io.Writer, log *slog.Logger) ([]counts, error) {
	l, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer l.close()
	return l.run(ctx, clk, out, log), nil
}

func main() {
	cfg, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, clock.Real{}, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "demo-load:", err)
		os.Exit(1)
	}
}
