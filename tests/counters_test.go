package tests

import (
	"context"
	"database/sql"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The counters' tests: each metric of docs/metrics.md's tables, read from /metrics
// before and after a scripted scenario, moves by what docs/metrics.md's meaning
// column says it does.

// scrape is one reading of a status port's /metrics.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t testing.TB, statusAddr string) scrape {
	t.Helper()
	resp, err := http.Get("http://" + statusAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", statusAddr, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s/metrics: %v", statusAddr, err)
	}
	return fams
}

// samples are the metric's samples whose labels hold every name, value
// pair of labels.
func (s scrape) samples(name string, labels ...string) []*dto.Metric {
	f := s[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, m := range f.GetMetric() {
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			ok = ok && found
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// v sums a counter's or gauge's matching samples (0 for none).
func (s scrape) v(name string, labels ...string) float64 {
	var sum float64
	for _, m := range s.samples(name, labels...) {
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// hist sums a histogram's matching samples' counts and sums.
func (s scrape) hist(name string, labels ...string) (count uint64, sum float64) {
	for _, m := range s.samples(name, labels...) {
		count += m.GetHistogram().GetSampleCount()
		sum += m.GetHistogram().GetSampleSum()
	}
	return count, sum
}

// delta is a counter's move between two scrapes.
func delta(before, after scrape, name string, labels ...string) float64 {
	return after.v(name, labels...) - before.v(name, labels...)
}

// wantDelta fails unless the counter moved by want (within 1e-6).
func wantDelta(t testing.TB, before, after scrape, want float64, name string, labels ...string) {
	t.Helper()
	d := delta(before, after, name, labels...)
	t.Logf("%s%v: +%g", name, labels, d)
	if math.Abs(d-want) > 1e-6 {
		t.Errorf("%s%v moved by %g, want %g", name, labels, d, want)
	}
}

// waitMetric polls statusAddr until ok holds of a scrape (up to d) and
// returns the last scrape.
func waitMetric(t testing.TB, statusAddr string, d time.Duration, ok func(scrape) bool) (scrape, bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		s := scrapeMetrics(t, statusAddr)
		if ok(s) {
			return s, true
		}
		if time.Now().After(deadline) {
			return s, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countingConn counts the bytes a client sends and receives.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// countedDB opens one-connection pool to addr as root whose bytes on the
// wire are added to n.
func countedDB(t testing.TB, addr string, n *atomic.Int64) *sql.DB {
	t.Helper()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", addr, "rgproxy_e2e"
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, n: n}, nil
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t testing.TB, c interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, qs ...string) {
	t.Helper()
	for _, q := range qs {
		if _, err := c.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// dialFrom opens a TCP connection to addr from the loopback address from
// and reads the proxy's first packet: the greeting, or an ERR in its place.
func dialFrom(t testing.TB, from, addr string) (net.Conn, uint16) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, p, err := readRaw(c)
	if err != nil {
		t.Fatalf("first packet from %s: %v", addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	code, _, _, _ := rawErr(p)
	return c, code
}

// rawAnswer reads one packet and returns its ERR code (0: not an ERR).
func rawAnswer(t testing.TB, c net.Conn) uint16 {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, p, err := readRaw(c)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	code, _, _, _ := rawErr(p)
	return code
}

// partialCommand sends the header of a COM_QUERY of size bytes and its
// first sent bytes.
func partialCommand(t testing.TB, c net.Conn, size, sent int) {
	t.Helper()
	h := []byte{byte(size), byte(size >> 8), byte(size >> 16), 0}
	body := make([]byte, sent)
	body[0] = gomysql.COM_QUERY
	for i := 1; i < sent; i++ {
		body[i] = ' '
	}
	if _, err := c.Write(append(h, body...)); err != nil {
		t.Fatal(err)
	}
}

// TestCountersWire covers the wire metrics (docs/metrics.md's first eleven rows)
// on a proxy without metering.
func TestCountersWire(t *testing.T) {
	px := startProxy(t, "--max-connections", "4", "--max-unauthenticated", "3", "--max-unauthenticated-per-host", "2",
		"--max-packet", "65536", "--command-buffer-limit", "65536", "--net-read-timeout", "1s")
	// startProxy's probe of the listener is a session for a moment.
	s0, _ := waitMetric(t, px.StatusAddr, 2*time.Second, func(s scrape) bool { return s.v("rgproxy_connections") == 0 })
	if v := s0.v("rgproxy_max_connections"); v != 4 {
		t.Errorf("rgproxy_max_connections = %v, want 4 (--max-connections)", v)
	}
	if v := s0.v("rgproxy_connections"); v != 0 {
		t.Errorf("rgproxy_connections = %v before any client, want 0", v)
	}

	// Statements by class, their durations, and the bytes of one session.
	var wire atomic.Int64
	db := countedDB(t, px.Addr, &wire)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, "CREATE TABLE IF NOT EXISTS counters_w (id INT PRIMARY KEY AUTO_INCREMENT, v VARCHAR(100))")
	if s, _ := waitMetric(t, px.StatusAddr, time.Second, func(s scrape) bool { return s.v("rgproxy_connections") == 1 }); s.v("rgproxy_connections") != 1 {
		t.Errorf("rgproxy_connections = %v with one session open, want 1", s.v("rgproxy_connections"))
	}
	b := scrapeMetrics(t, px.StatusAddr)
	wb := wire.Load()
	mustExec(t, conn, "SELECT 1", "SELECT 2", "SELECT SLEEP(0.2)", // read
		"INSERT INTO counters_w (v) VALUES ('a')", "INSERT INTO counters_w (v) VALUES ('b')", // write
		"SET @c = 1", "SET @d = 2", "SET @e = 3") // other
	if err := conn.PingContext(context.Background()); err != nil { // free
		t.Fatal(err)
	}
	a := scrapeMetrics(t, px.StatusAddr)
	sent := float64(wire.Load() - wb)
	for _, c := range []struct {
		class string
		n     float64
	}{{"read", 3}, {"write", 2}, {"other", 3}, {"free", 1}} {
		wantDelta(t, b, a, c.n, "rgproxy_statements_total", "class", c.class)
		n0, _ := b.hist("rgproxy_statement_duration_seconds", "class", c.class)
		n1, _ := a.hist("rgproxy_statement_duration_seconds", "class", c.class)
		if float64(n1-n0) != c.n {
			t.Errorf("rgproxy_statement_duration_seconds{class=%q} observed %d statements, want %v", c.class, n1-n0, c.n)
		}
	}
	_, sum0 := b.hist("rgproxy_statement_duration_seconds", "class", "read")
	_, sum1 := a.hist("rgproxy_statement_duration_seconds", "class", "read")
	if d := sum1 - sum0; d < 0.2 || d > 1 {
		t.Errorf("rgproxy_statement_duration_seconds{class=\"read\"} grew by %.3f s for SELECT SLEEP(0.2) and two SELECTs, want 0.2–1", d)
	}
	// A relayed statement crosses both sides byte for byte.
	wantDelta(t, b, a, sent, "rgproxy_client_bytes_total")
	wantDelta(t, b, a, sent, "rgproxy_backend_bytes_total")

	// A backend that closes an idle session closes its client: not an
	// error. One lost while a statement runs on it is.
	var id int64
	if err := conn.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	b = scrapeMetrics(t, px.StatusAddr)
	rootExec(t, "KILL CONNECTION "+strconv.FormatInt(id, 10))
	a, _ = waitMetric(t, px.StatusAddr, 3*time.Second, func(s scrape) bool { return s.v("rgproxy_connections") == 0 })
	if v := a.v("rgproxy_connections"); v != 0 {
		t.Errorf("rgproxy_connections = %v after the only session lost its backend while idle, want 0", v)
	}
	wantDelta(t, b, a, 0, "rgproxy_backend_errors_total")
	conn.Close()
	busy := rootConn(t, px.Addr)
	if err := busy.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	b = scrapeMetrics(t, px.StatusAddr)
	killed := make(chan error, 1)
	go func() { killed <- sqlRun(busy, "SELECT SLEEP(5)") }()
	time.Sleep(300 * time.Millisecond)
	rootExec(t, "KILL CONNECTION "+strconv.FormatInt(id, 10))
	if err := <-killed; mysqlErrNo(err) != 1927 {
		t.Errorf("a statement whose backend connection was killed got %v, want 1927", err)
	}
	busy.Close()
	a, _ = waitMetric(t, px.StatusAddr, 3*time.Second, func(s scrape) bool { return s.v("rgproxy_connections") == 0 })
	wantDelta(t, b, a, 1, "rgproxy_backend_errors_total")

	// Sessions beyond --max-connections: 1040, without a backend connection.
	b = scrapeMetrics(t, px.StatusAddr)
	var open []net.Conn
	for range 4 {
		c, err := rawLogin(px.Addr)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	c, code := dialFrom(t, "127.0.0.1", px.Addr)
	c.Close()
	if code != 1040 {
		t.Errorf("a fifth session got %d, want 1040", code)
	}
	a = scrapeMetrics(t, px.StatusAddr)
	wantDelta(t, b, a, 1, "rgproxy_connections_refused_total", "reason", "max_connections")
	wantDelta(t, b, a, 1, "rgproxy_connections_refused_total")
	if v := a.v("rgproxy_connections"); v != 4 {
		t.Errorf("rgproxy_connections = %v with four sessions, want 4", v)
	}
	for _, c := range open {
		c.Close()
	}
	waitMetric(t, px.StatusAddr, 3*time.Second, func(s scrape) bool { return s.v("rgproxy_connections") == 0 })

	// Connections that do not log in: two per host, three in all.
	b = scrapeMetrics(t, px.StatusAddr)
	open = open[:0]
	for _, from := range []string{"127.0.0.1", "127.0.0.1", "127.0.0.2"} {
		c, code := dialFrom(t, from, px.Addr)
		if code != 0 {
			t.Fatalf("connection from %s refused with %d", from, code)
		}
		open = append(open, c)
	}
	if v := scrapeMetrics(t, px.StatusAddr).v("rgproxy_unauthenticated_connections"); v != 3 {
		t.Errorf("rgproxy_unauthenticated_connections = %v with three waiting to log in, want 3", v)
	}
	c, code = dialFrom(t, "127.0.0.2", px.Addr) // the fourth: beyond --max-unauthenticated
	c.Close()
	if code != 1040 {
		t.Errorf("a fourth unauthenticated connection got %d, want 1040", code)
	}
	open[2].Close() // 127.0.0.2's place is free again
	waitMetric(t, px.StatusAddr, 3*time.Second, func(s scrape) bool { return s.v("rgproxy_unauthenticated_connections") == 2 })
	c, code = dialFrom(t, "127.0.0.1", px.Addr) // a third from one host
	c.Close()
	if code != 1040 {
		t.Errorf("a third unauthenticated connection from one host got %d, want 1040", code)
	}
	a = scrapeMetrics(t, px.StatusAddr)
	wantDelta(t, b, a, 1, "rgproxy_connections_refused_total", "reason", "unauthenticated")
	wantDelta(t, b, a, 1, "rgproxy_connections_refused_total", "reason", "unauthenticated_per_host")
	wantDelta(t, b, a, 0, "rgproxy_connections_refused_total", "reason", "max_connections")
	for _, c := range open[:2] {
		c.Close()
	}
	if s, ok := waitMetric(t, px.StatusAddr, 3*time.Second, func(s scrape) bool { return s.v("rgproxy_unauthenticated_connections") == 0 }); !ok {
		t.Errorf("rgproxy_unauthenticated_connections = %v after they closed, want 0", s.v("rgproxy_unauthenticated_connections"))
	}

	// Protocol errors, one of each kind.
	b = scrapeMetrics(t, px.StatusAddr)
	if code, _, _, _, err := handshakeAnswer(px.Addr, handshakeCases[0].wire); err != nil || code != 1043 {
		t.Errorf("a bad handshake got %d (%v), want 1043", code, err)
	}
	if code, _, _, _, err := handshakeAnswer(px.Addr, handshakeCases[2].wire); err != nil || code != 1156 {
		t.Errorf("a handshake out of order got %d (%v), want 1156", code, err)
	}
	login := func() net.Conn {
		c, err := rawLogin(px.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c = login()
	partialCommand(t, c, 70000, 1) // beyond --max-packet
	if code := rawAnswer(t, c); code != 1153 {
		t.Errorf("a command beyond --max-packet got %d, want 1153", code)
	}
	c = login()
	if err := writeRaw(c, 0, nil); err != nil { // an empty command
		t.Fatal(err)
	}
	if code := rawAnswer(t, c); code != 1047 {
		t.Errorf("an empty command got %d, want 1047", code)
	}
	// Bytes held for commands being received, beyond each one's first 16 KiB.
	held := login()
	partialCommand(t, held, 60000, 40000)
	// Its buffer doubled from 4 KiB as the bytes came, to 32 KiB, then to
	// the command's 60,000 bytes: 60,000 − 16,384 are held beyond 16 KiB.
	s, _ := waitMetric(t, px.StatusAddr, 500*time.Millisecond, func(s scrape) bool { return s.v("rgproxy_command_buffer_bytes") >= 60000-16384 })
	t.Logf("rgproxy_command_buffer_bytes with 40,000 bytes of a 60,000-byte command received: %v", s.v("rgproxy_command_buffer_bytes"))
	if got := s.v("rgproxy_command_buffer_bytes"); got != 60000-16384 {
		t.Errorf("rgproxy_command_buffer_bytes = %v with 40,000 bytes of a 60,000-byte command received, want %d", got, 60000-16384)
	}
	c = login()
	partialCommand(t, c, 60000, 50000) // beyond --command-buffer-limit with the first
	if code := rawAnswer(t, c); code != 1041 {
		t.Errorf("a command beyond --command-buffer-limit got %d, want 1041", code)
	}
	// The held command then times out (--net-read-timeout 1s).
	if code := rawAnswer(t, held); code != 1159 {
		t.Errorf("a command stalled beyond --net-read-timeout got %d, want 1159", code)
	}
	a, _ = waitMetric(t, px.StatusAddr, time.Second, func(s scrape) bool { return s.v("rgproxy_command_buffer_bytes") == 0 })
	for _, k := range []string{"bad_handshake", "out_of_order", "too_large", "malformed", "buffer_limit", "read_timeout"} {
		wantDelta(t, b, a, 1, "rgproxy_protocol_errors_total", "kind", k)
	}
	if v := a.v("rgproxy_command_buffer_bytes"); v != 0 {
		t.Errorf("rgproxy_command_buffer_bytes = %v once no command is being received, want 0", v)
	}

	// A backend that cannot be dialed.
	dead := startProxy(t, "--backend", freeAddr(t))
	// The harness's readiness dial is itself a session, whose backend dial
	// fails too; on a busy machine it is counted after startProxy returns.
	b, _ = waitMetric(t, dead.StatusAddr, 5*time.Second, func(s scrape) bool { return s.v("rgproxy_backend_errors_total") >= 1 })
	if c, err := rawLogin(dead.Addr); err == nil {
		c.Close()
		t.Fatal("a proxy without a backend let a client log in")
	}
	a = scrapeMetrics(t, dead.StatusAddr)
	wantDelta(t, b, a, 1, "rgproxy_backend_errors_total")
}

// readmeMetric is a row of the metrics tables (docs/metrics.md, linked
// from README).
type readmeMetric struct {
	typ, meaning string
}

// readmeMetrics parses docs/metrics.md's rgproxy and rgserver metrics tables.
func readmeMetrics(t testing.TB) map[string]readmeMetric {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `((?:rgproxy|rgserver)_[a-z_]+)` \\| (counter|gauge|histogram) \\|[^|]*\\| (.+) \\|$")
	out := map[string]readmeMetric{}
	for _, line := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			out[m[1]] = readmeMetric{typ: m[2], meaning: m[3]}
		}
	}
	if len(out) < 50 {
		t.Fatalf("docs/metrics.md's tables have %d rows, want every metric", len(out))
	}
	return out
}

// normalizeHelp makes docs/metrics.md's meaning and a HELP text comparable:
// markdown backticks dropped, the first letter lower case, no final full
// stop.
func normalizeHelp(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "`", ""))
	s = strings.TrimSuffix(s, ".")
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToLower(r)) + s[n:]
}

// checkHelpIsReadme fails for every rgproxy_/rgserver_ metric of the
// scrapes that docs/metrics.md's tables lack, whose type differs, or whose HELP
// says something else than docs/metrics.md's meaning; and for every row of
// prefix that none of the scrapes exports.
func checkHelpIsReadme(t testing.TB, prefix string, scrapes ...scrape) {
	t.Helper()
	readme := readmeMetrics(t)
	seen := map[string]bool{}
	for _, s := range scrapes {
		for name, f := range s {
			if !strings.HasPrefix(name, "rgproxy_") && !strings.HasPrefix(name, "rgserver_") {
				continue
			}
			seen[name] = true
			r, ok := readme[name]
			if !ok {
				t.Errorf("%s is exported but has no row in docs/metrics.md's tables", name)
				continue
			}
			if typ := strings.ToLower(f.GetType().String()); typ != r.typ {
				t.Errorf("%s is a %s, docs/metrics.md says %s", name, typ, r.typ)
			}
			if got, want := normalizeHelp(f.GetHelp()), normalizeHelp(r.meaning); got != want {
				t.Errorf("%s HELP differs from docs/metrics.md's meaning:\n HELP:   %s\n docs:   %s", name, got, want)
			}
		}
	}
	for name := range readme {
		if strings.HasPrefix(name, prefix) && !seen[name] {
			t.Errorf("docs/metrics.md documents %s but no scrape exports it", name)
		}
	}
}

// TestMetricsHelpIsReadme: every metric rgproxy and rgserver export has a
// row in docs/metrics.md's tables, and its HELP text is the row's meaning.
func TestMetricsHelpIsReadme(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, serviceAccount(t)...) // --admin-user: rgproxy_binlog_lag_seconds
	// A child, so that rgserver_resource_group_parent_info exists.
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_help_child", "DROP RESOURCE GROUP IF EXISTS rg_help",
		"CREATE RESOURCE GROUP rg_help RU_PER_SEC = 1000 QUERY_LIMIT = (EXEC_ELAPSED = '50ms', ACTION = DRYRUN)",
		"CREATE RESOURCE GROUP rg_help_child RU_PER_SEC = 10 PARENT = rg_help")
	db := openDB(t, px.Addr)
	// A runaway, so that rgproxy_runaway_total exists; a limited group
	// in use, so that its tokens do.
	mustExec(t, db, "SELECT /*+ RESOURCE_GROUP(rg_help) */ SLEEP(0.1)")
	if _, err := db.Exec("SELECT * FROM information_schema.cluster_resource_group_usage"); err != nil {
		t.Fatal(err)
	}
	sp, ok := waitMetric(t, px.StatusAddr, 5*time.Second, func(s scrape) bool {
		return s["rgproxy_runaway_total"] != nil && s["rgproxy_group_tokens"] != nil && s["rgproxy_binlog_lag_seconds"] != nil
	})
	if !ok {
		t.Logf("rgproxy_runaway_total, rgproxy_group_tokens or rgproxy_binlog_lag_seconds missing after 5 s")
	}
	// A KILL rule and a proxy without the service account, so that
	// rgproxy_query_limit_unenforced exists (on that proxy).
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_help_kill",
		"CREATE RESOURCE GROUP rg_help_kill RU_PER_SEC = 1000 QUERY_LIMIT = (EXEC_ELAPSED = '10s', ACTION = KILL)")
	plain := startMeteredProxy(t, ts)
	su, ok := waitMetric(t, plain.StatusAddr, 5*time.Second, func(s scrape) bool { return s["rgproxy_query_limit_unenforced"] != nil })
	if !ok {
		t.Logf("rgproxy_query_limit_unenforced missing after 5 s on a proxy without --admin-user")
	}
	for k, v := range su {
		if sp[k] == nil {
			sp[k] = v
		}
	}
	checkHelpIsReadme(t, "rgproxy_", sp)
	// The reader has nothing newer to read, or follows no log: 0.
	if s, ok := waitMetric(t, px.StatusAddr, 3*time.Second, func(s scrape) bool { return s.v("rgproxy_binlog_lag_seconds") == 0 }); !ok {
		t.Errorf("rgproxy_binlog_lag_seconds = %v on an idle backend, want 0", s.v("rgproxy_binlog_lag_seconds"))
	}
	// A budget whose NOTIFY one statement crosses, so that rgserver's
	// budget series exist.
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_help_budget",
		"CREATE RESOURCE GROUP rg_help_budget RU_PER_SEC = 1000 BUDGET = (RU = 1 PER MONTH, ON 1 PERCENT NOTIFY)")
	mustExec(t, db, "SELECT /*+ RESOURCE_GROUP(rg_help_budget) */ SLEEP(0.01)")
	ss, ok := waitMetric(t, ts.StatusAddr, 10*time.Second, func(s scrape) bool {
		return s["rgserver_budget_action_in_force"] != nil && s["rgserver_budget_exhaustion_seconds"] != nil && s["rgserver_budget_actions_total"] != nil
	})
	if !ok {
		t.Logf("rgserver's budget series missing after 10 s")
	}
	checkHelpIsReadme(t, "rgserver_", ss)
}

// sqlRun runs q on conn, reading any rows it returns, and gives its error.
func sqlRun(conn *sql.Conn, q string) error {
	rows, err := conn.QueryContext(context.Background(), q)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.Err()
}

// groupConn is a root session of px in group.
func groupConn(t testing.TB, px *proxy, group string) *sql.Conn {
	t.Helper()
	c := rootConn(t, px.Addr)
	mustExec(t, c, "SET RESOURCE GROUP "+group)
	return c
}

// wantNear fails unless got is want within tol.
func wantNear(t testing.TB, what string, got, want, tol float64) {
	t.Helper()
	t.Logf("%s = %g (want %g ± %g)", what, got, want, tol)
	if math.Abs(got-want) > tol {
		t.Errorf("%s = %g, want %g ± %g", what, got, want, tol)
	}
}

// TestCountersMetered covers the per-group metrics of a metering proxy
// and rgserver's, around statements whose costs SHOW LAST STATEMENT RU
// reports, a refusal, MODE WARN, and a runaway of each action.
func TestCountersMetered(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, append(serviceAccount(t), "--cpu-source", "wall", "--write-source", "packet",
		"--max-wait", "1s", "--degraded-after", "1s")...)
	var create []string
	for _, g := range []string{
		"rg_c RU_PER_SEC = 100000",
		"rg_t RU_PER_SEC = 2 BURSTABLE = OFF",
		"rg_warn RU_PER_SEC = 10 BURSTABLE = OFF MODE = WARN",
		"rg_warn2 RU_PER_SEC = 10 BURSTABLE = OFF MODE = WARN",
		"rg_e RU_PER_SEC = 10 BURSTABLE = OFF",
		"rg_dry RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = DRYRUN)",
		"rg_sw RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = SWITCH_GROUP(rg_c))",
		"rg_kill RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '200ms', ACTION = KILL)",
		"rg_cool RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = COOLDOWN, WATCH = EXACT DURATION = '1m')",
		"rg_q RU_PER_SEC = 100000",
		"rg_bu RU_PER_SEC = 100 BURSTABLE = UNLIMITED",
	} {
		name, _, _ := strings.Cut(g, " ")
		create = append(create, "DROP RESOURCE GROUP IF EXISTS "+name, "CREATE RESOURCE GROUP "+g)
	}
	adminExec(t, px.Addr, create...)
	adminExec(t, px.Addr, "CREATE TABLE IF NOT EXISTS counters_m (id INT AUTO_INCREMENT PRIMARY KEY, v TEXT)")

	// Metered statements: their RU, by type, and their classes.
	conn := groupConn(t, px, "rg_c")
	b := scrapeMetrics(t, px.StatusAddr)
	insert := "INSERT INTO counters_m (v) VALUES ('" + strings.Repeat("x", 3000) + "')"
	var rru, wru float64
	for _, q := range []string{"SELECT 1", "SELECT REPEAT('a', 100000)", insert, "SET @m = 1"} {
		if err := sqlRun(conn, q); err != nil {
			t.Fatalf("%.40s: %v", q, err)
		}
		last := lastStatementRU(t, conn) // rgproxy's own answer: neither forwarded nor metered
		rru += num(t, last["RRU"])
		wru += num(t, last["WRU"])
	}
	a := scrapeMetrics(t, px.StatusAddr)
	for _, c := range []struct {
		class string
		n     float64
	}{{"read", 2}, {"write", 1}, {"other", 1}, {"free", 0}} {
		wantDelta(t, b, a, c.n, "rgproxy_group_statements_total", "resource_group", "rg_c", "class", c.class)
		wantDelta(t, b, a, c.n, "rgproxy_statements_total", "class", c.class)
	}
	wantNear(t, "rgproxy_ru_consumed_total{rg_c,rru} delta", delta(b, a, "rgproxy_ru_consumed_total", "resource_group", "rg_c", "type", "rru"), rru, 0.01)
	wantNear(t, "rgproxy_ru_consumed_total{rg_c,wru} delta", delta(b, a, "rgproxy_ru_consumed_total", "resource_group", "rg_c", "type", "wru"), wru, 0.01)
	// The INSERT's payload: its command byte and its text.
	wantDelta(t, b, a, float64(1+len(insert)), "rgproxy_written_bytes_total", "resource_group", "rg_c", "source", "packet")
	wantDelta(t, b, a, 0, "rgproxy_written_bytes_total", "resource_group", "rg_c", "source", "binlog")
	wantDelta(t, b, a, 0, "rgproxy_written_bytes_total", "resource_group", "rg_c", "source", "estimate")

	// 8252, and only 8252, is throttled: a statement run inside a
	// transaction on the session's debt is not. ~5 RU of result bytes at
	// 2 RU/s leave the bucket owing more than the 100 ms a statement waits
	// inside a transaction can pay: the next ones run on the session's
	// debt, up to 2 RU (one second of the rate), then get 8252; after the
	// COMMIT the debt cannot be repaid within --max-wait: 8252 again.
	tc := groupConn(t, px, "rg_t")
	b = scrapeMetrics(t, px.StatusAddr)
	refusals, onDebt := 0, 0
	step := func(q string) uint16 {
		t.Helper()
		err := sqlRun(tc, q)
		code := mysqlErrNo(err)
		switch {
		case code == 8252:
			refusals++
		case err != nil:
			t.Fatalf("%s in rg_t: %v", q, err)
		}
		return code
	}
	step("BEGIN")
	step("SELECT REPEAT('a', 300000)")
	for i := 0; i < 8 && step("SELECT 1") == 0; i++ {
		onDebt++
	}
	step("COMMIT")
	if code := step("SELECT 2"); code != 8252 {
		t.Errorf("SELECT 2 after a transaction that ran on debt in rg_t: error %d, want 8252", code)
	}
	a = scrapeMetrics(t, px.StatusAddr)
	t.Logf("rg_t: %d statements ran on the session's debt, %d refused with 8252", onDebt, refusals)
	if onDebt == 0 || refusals != 2 {
		t.Errorf("rg_t: %d statements ran on debt and %d were refused; want some on debt and 2 refused", onDebt, refusals)
	}
	wantDelta(t, b, a, float64(refusals), "rgproxy_throttled_total", "resource_group", "rg_t")
	if n0, _ := b.hist("rgproxy_throttle_wait_seconds", "resource_group", "rg_t"); true {
		n1, _ := a.hist("rgproxy_throttle_wait_seconds", "resource_group", "rg_t")
		t.Logf("rgproxy_throttle_wait_seconds{rg_t}: %d statements got tokens", n1-n0)
		if n1 <= n0 {
			t.Errorf("rgproxy_throttle_wait_seconds{rg_t} observed no statement that got its tokens")
		}
	}

	// MODE WARN: what ENFORCE would have done with the statements' real
	// cost. 10 RU of result bytes (and a few ms of backend time) in a
	// 10 RU/s group without burst leave it owing about a second's worth:
	// the next statement would wait for tokens; 40 RU, then the next
	// would be refused (it cannot be paid within --max-wait).
	b = scrapeMetrics(t, px.StatusAddr)
	w2 := groupConn(t, px, "rg_warn2")
	for _, q := range []string{"SELECT REPEAT('a', 655360)", "SELECT 1"} {
		if err := sqlRun(w2, q); err != nil {
			t.Fatal(err)
		}
	}
	if would := lastStatementRU(t, w2)["WOULD"]; !strings.HasPrefix(would, "wait") {
		t.Errorf("SHOW LAST STATEMENT RU's WOULD after a statement that ENFORCE would have made wait: %q", would)
	}
	w1 := groupConn(t, px, "rg_warn")
	for _, q := range []string{"SELECT REPEAT('a', 2621440)", "SELECT 1"} {
		if err := sqlRun(w1, q); err != nil {
			t.Fatal(err)
		}
	}
	a = scrapeMetrics(t, px.StatusAddr)
	wantDelta(t, b, a, 1, "rgproxy_would_wait_total", "resource_group", "rg_warn2")
	wantDelta(t, b, a, 0, "rgproxy_would_throttle_total", "resource_group", "rg_warn2")
	if d := delta(b, a, "rgproxy_would_wait_seconds_total", "resource_group", "rg_warn2"); d <= 0 || d > 1 {
		t.Errorf("rgproxy_would_wait_seconds_total{rg_warn2} moved by %g, want a wait within --max-wait (0, 1]", d)
	} else {
		t.Logf("rgproxy_would_wait_seconds_total{rg_warn2}: +%.3f", d)
	}
	wantDelta(t, b, a, 1, "rgproxy_would_throttle_total", "resource_group", "rg_warn")
	wantDelta(t, b, a, 0, "rgproxy_would_wait_total", "resource_group", "rg_warn")
	wantDelta(t, b, a, 0, "rgproxy_throttled_total", "resource_group", "rg_warn")

	// ENFORCE under the same load: the statement waits, and the wait
	// histogram holds what SHOW LAST STATEMENT RU says it waited.
	ec := groupConn(t, px, "rg_e")
	b = scrapeMetrics(t, px.StatusAddr)
	waited := 0.0
	for _, q := range []string{"SELECT REPEAT('a', 327680)", "SELECT 1"} {
		if err := sqlRun(ec, q); err != nil {
			t.Fatal(err)
		}
		waited += num(t, lastStatementRU(t, ec)["THROTTLE_WAIT_MS"]) / 1000
	}
	a = scrapeMetrics(t, px.StatusAddr)
	n0, sum0 := b.hist("rgproxy_throttle_wait_seconds", "resource_group", "rg_e")
	n1, sum1 := a.hist("rgproxy_throttle_wait_seconds", "resource_group", "rg_e")
	if n1-n0 != 2 {
		t.Errorf("rgproxy_throttle_wait_seconds{rg_e} observed %d statements, want the 2 that got their tokens", n1-n0)
	}
	wantNear(t, "rgproxy_throttle_wait_seconds{rg_e} sum delta", sum1-sum0, waited, 0.005)
	if waited <= 0 {
		t.Errorf("SELECT 1 after 5 RU in a 10 RU/s group without burst, when it had just got its first tokens, did not wait")
	}
	wantDelta(t, b, a, 0, "rgproxy_throttled_total", "resource_group", "rg_e")

	// Runaways, each counted once, by the action taken.
	b = scrapeMetrics(t, px.StatusAddr)
	run := func(group, q string, want uint16) {
		t.Helper()
		if got := mysqlErrNo(sqlRun(groupConn(t, px, group), q)); got != want {
			t.Errorf("%s in %s: error %d, want %d", q, group, got, want)
		}
	}
	run("rg_dry", "SELECT SLEEP(0.3)", 0)
	run("rg_sw", "SELECT SLEEP(0.3)", 0)
	run("rg_kill", "SELECT SLEEP(3)", 8253)
	run("rg_cool", "SELECT SLEEP(0.3)", 0) // crosses the limit; its text is watched from now on
	root := openDB(t, px.Addr)
	deadline := time.Now().Add(3 * time.Second)
	for len(rowsOf(t, root, "SELECT * FROM information_schema.runaway_watches WHERE RESOURCE_GROUP_NAME = 'rg_cool'")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no watch for rg_cool 3 s after its COOLDOWN rule fired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	run("rg_cool", "SELECT SLEEP(0.3)", 0) // matches the watch, and crosses the limit again
	run("rg_cool", "SELECT SLEEP(0.3)", 0)
	adminExec(t, px.Addr, "QUERY WATCH ADD RESOURCE GROUP rg_q ACTION KILL SQL TEXT EXACT TO 'SELECT 42'")
	deadline = time.Now().Add(3 * time.Second)
	for mysqlErrNo(sqlRun(groupConn(t, px, "rg_q"), "SELECT 42")) != 8254 {
		if time.Now().After(deadline) {
			t.Fatal("SELECT 42 not quarantined 3 s after QUERY WATCH ADD")
		}
		time.Sleep(50 * time.Millisecond)
	}
	a = scrapeMetrics(t, px.StatusAddr)
	wantDelta(t, b, a, 1, "rgproxy_runaway_total", "resource_group", "rg_dry", "action", "DRYRUN")
	wantDelta(t, b, a, 1, "rgproxy_runaway_total", "resource_group", "rg_sw", "action", "SWITCH_GROUP")
	wantDelta(t, b, a, 1, "rgproxy_runaway_total", "resource_group", "rg_kill", "action", "KILL")
	wantDelta(t, b, a, 3, "rgproxy_runaway_total", "resource_group", "rg_cool", "action", "COOLDOWN")
	wantDelta(t, b, a, 1, "rgproxy_runaway_total", "resource_group", "rg_q", "action", "KILL")
	wantDelta(t, b, a, 7, "rgproxy_runaway_total")

	// Gauges.
	if err := sqlRun(groupConn(t, px, "rg_bu"), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	a = scrapeMetrics(t, px.StatusAddr)
	for _, g := range []struct {
		group string
		want  float64
	}{{"rg_c", 100000}, {"rg_warn", 10}, {"rg_bu", math.Inf(1)}, {"default", math.Inf(1)}} {
		if v := a.v("rgproxy_group_ru_per_sec", "resource_group", g.group); v != g.want {
			t.Errorf("rgproxy_group_ru_per_sec{%s} = %v, want %v", g.group, v, g.want)
		}
	}
	if len(a.samples("rgproxy_group_tokens", "resource_group", "rg_t")) != 1 {
		t.Errorf("rgproxy_group_tokens{rg_t} missing for a limited group in use")
	} else if v := a.v("rgproxy_group_tokens", "resource_group", "rg_t"); v > 2 {
		t.Errorf("rgproxy_group_tokens{rg_t} = %v beyond its capacity (2 RU, BURSTABLE OFF)", v)
	}
	if len(a.samples("rgproxy_group_tokens", "resource_group", "rg_warn")) != 0 {
		t.Errorf("rgproxy_group_tokens{rg_warn} exported for a group in MODE WARN, which is never throttled")
	}
	for src, want := range map[string]float64{"wall": 1, "proc": 0} {
		if v := a.v("rgproxy_cpu_source", "source", src); v != want {
			t.Errorf("rgproxy_cpu_source{%s} = %v with --cpu-source wall, want %v", src, v, want)
		}
	}
	for src, want := range map[string]float64{"packet": 1, "binlog": 0, "estimate": 0} {
		if v := a.v("rgproxy_write_source", "source", src); v != want {
			t.Errorf("rgproxy_write_source{%s} = %v with --write-source packet, want %v", src, v, want)
		}
	}
	if v := a.v("rgproxy_token_requests_total", "resource_group", "rg_t"); v <= 0 {
		t.Errorf("rgproxy_token_requests_total{rg_t} = %v after the group asked for tokens", v)
	}
	if n, _ := a.hist("rgproxy_token_request_duration_seconds"); n == 0 {
		t.Errorf("rgproxy_token_request_duration_seconds observed no token request")
	}
	if v := a.v("rgproxy_degraded"); v != 0 {
		t.Errorf("rgproxy_degraded = %v with rgserver up, want 0", v)
	}

	// rgserver's view: what the proxy reports, summed (one proxy here).
	sb := scrapeMetrics(t, ts.StatusAddr)
	if _, err := root.Exec("SELECT * FROM information_schema.cluster_resource_group_usage"); err != nil {
		t.Fatal(err)
	}
	var pa, sa scrape
	ok := false
	deadline = time.Now().Add(8 * time.Second)
	for !ok && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		pa, sa = scrapeMetrics(t, px.StatusAddr), scrapeMetrics(t, ts.StatusAddr)
		ok = sa.v("rgserver_throttled_total", "resource_group", "rg_t") == pa.v("rgproxy_throttled_total", "resource_group", "rg_t") &&
			math.Abs(sa.v("rgserver_ru_consumed_total", "resource_group", "rg_c")-pa.v("rgproxy_ru_consumed_total", "resource_group", "rg_c")) < 1e-6 &&
			math.Abs(sa.v("rgserver_tokens_granted_total", "resource_group", "rg_t")-pa.v("rgproxy_tokens_granted_total", "resource_group", "rg_t")) < 1e-6 &&
			sa.v("rgserver_bucket_states_written_total") > 0
	}
	for _, typ := range []string{"rru", "wru"} {
		wantNear(t, "rgserver_ru_consumed_total{rg_c,"+typ+"}", sa.v("rgserver_ru_consumed_total", "resource_group", "rg_c", "type", typ),
			pa.v("rgproxy_ru_consumed_total", "resource_group", "rg_c", "type", typ), 1e-6)
	}
	wantNear(t, "rgserver_statements_total{rg_c}", sa.v("rgserver_statements_total", "resource_group", "rg_c"),
		pa.v("rgproxy_group_statements_total", "resource_group", "rg_c"), 0)
	wantNear(t, "rgserver_throttled_total{rg_t}", sa.v("rgserver_throttled_total", "resource_group", "rg_t"),
		pa.v("rgproxy_throttled_total", "resource_group", "rg_t"), 0)
	wantNear(t, "rgserver_tokens_granted_total{rg_t}", sa.v("rgserver_tokens_granted_total", "resource_group", "rg_t"),
		pa.v("rgproxy_tokens_granted_total", "resource_group", "rg_t"), 1e-6)
	if v := sa.v("rgserver_read_bytes_total", "resource_group", "rg_c"); v < 100000 {
		t.Errorf("rgserver_read_bytes_total{rg_c} = %v after a 100,000-byte result", v)
	}
	if v := sa.v("rgserver_write_bytes_total", "resource_group", "rg_c"); v < 3000 {
		t.Errorf("rgserver_write_bytes_total{rg_c} = %v after a 3,000-byte INSERT", v)
	}
	if v := sa.v("rgserver_backend_seconds_total", "resource_group", "rg_dry"); v < 0.3 {
		t.Errorf("rgserver_backend_seconds_total{rg_dry} = %v after SELECT SLEEP(0.3)", v)
	}
	for name, want := range map[string]float64{"rgserver_is_leader": 1, "rgserver_insecure": 1, "rgserver_granting_from_memory": 0,
		"rgserver_etcd_degraded": 0, "rgserver_persist_errors_total": 0, "rgserver_inspect_streams": 1,
		"rgserver_cluster_inspect_unanswered_total": 0} {
		if v := sa.v(name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	for g, want := range map[string]float64{"rg_c": 100000, "rg_warn": 10, "rg_bu": 100, "default": math.Inf(1)} {
		if v := sa.v("rgserver_group_ru_per_sec", "resource_group", g); v != want {
			t.Errorf("rgserver_group_ru_per_sec{%s} = %v, want %v", g, v, want)
		}
	}
	if v := sa.v("rgserver_group_clients", "resource_group", "rg_c"); v != 1 {
		t.Errorf("rgserver_group_clients{rg_c} = %v with one proxy using it, want 1", v)
	}
	if len(sa.samples("rgserver_group_tokens", "resource_group", "rg_t")) != 1 || len(sa.samples("rgserver_group_tokens", "resource_group", "rg_warn")) != 0 {
		t.Errorf("rgserver_group_tokens: want a series for rg_t (limited), none for rg_warn (MODE WARN)")
	}
	if v := sa.v("rgserver_bucket_states_written_total"); v <= 0 {
		t.Errorf("rgserver_bucket_states_written_total = %v after groups consumed", v)
	}
	if n, _ := sa.hist("rgserver_acquire_tokens_duration_seconds"); n == 0 {
		t.Errorf("rgserver_acquire_tokens_duration_seconds observed no AcquireTokens message")
	}
	n0, _ = sb.hist("rgserver_cluster_inspect_duration_seconds")
	n1, _ = sa.hist("rgserver_cluster_inspect_duration_seconds")
	if n1-n0 != 1 {
		t.Errorf("rgserver_cluster_inspect_duration_seconds observed %d views for one cluster_resource_group_usage read, want 1", n1-n0)
	}

	// A proxy that does not answer a cluster-wide view (stopped).
	px2 := startMeteredProxy(t, ts)
	if s, ok := waitMetric(t, ts.StatusAddr, 5*time.Second, func(s scrape) bool { return s.v("rgserver_inspect_streams") == 2 }); !ok {
		t.Fatalf("rgserver_inspect_streams = %v with two proxies, want 2", s.v("rgserver_inspect_streams"))
	}
	px2.pause(t)
	sb = scrapeMetrics(t, ts.StatusAddr)
	if _, err := root.Exec("SELECT * FROM information_schema.cluster_resource_group_usage"); err != nil {
		t.Fatal(err)
	}
	sa = scrapeMetrics(t, ts.StatusAddr)
	wantDelta(t, sb, sa, 1, "rgserver_cluster_inspect_unanswered_total")
	if _, sum := sa.hist("rgserver_cluster_inspect_duration_seconds"); true {
		_, sum0 := sb.hist("rgserver_cluster_inspect_duration_seconds")
		wantNear(t, "rgserver_cluster_inspect_duration_seconds sum delta with a proxy stopped", sum-sum0, 0.5, 0.1)
	}
	px2.resume()

	// rgserver gone: the proxy refills locally after --degraded-after.
	ts.stop(10 * time.Second)
	if _, ok := waitMetric(t, px.StatusAddr, 5*time.Second, func(s scrape) bool { return s.v("rgproxy_degraded") == 1 }); !ok {
		t.Errorf("rgproxy_degraded not 1 within 5 s of rgserver stopping (--degraded-after 1s)")
	}
}

// TestCountersRgserverGuards covers rgserver's refusals: gRPC calls
// without a credential, with an unknown one, a proxy's on an admin RPC,
// beyond a credential's streams; token requests clamped; unknown groups
// answered from the miss cache.
func TestCountersRgserverGuards(t *testing.T) {
	dir := t.TempDir()
	adminFile, proxyFile := filepath.Join(dir, "admin.token"), filepath.Join(dir, "proxy.token")
	if err := os.WriteFile(adminFile, []byte("adm1n-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(proxyFile, []byte("px pr0xy-token-0123456789 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startTokenServer(t, "--admin-token-file", adminFile, "--proxy-token-file", proxyFile)
	conn, err := grpc.NewClient(ts.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bearer := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	rg := pb.NewResourceGroupServiceClient(conn)
	create := func(ctx context.Context, name string) error {
		_, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: name, RuPerSec: 10}})
		return err
	}
	if err := create(bearer("adm1n-token-0123456789"), "rg_guard"); err != nil {
		t.Fatal(err)
	}
	b := scrapeMetrics(t, ts.StatusAddr)
	for _, c := range []context.Context{ctx, bearer("nope"), bearer("pr0xy-token-0123456789")} {
		if create(c, "rg_guard_no") == nil {
			t.Fatal("CreateGroup without an admin credential succeeded")
		}
	}
	a := scrapeMetrics(t, ts.StatusAddr)
	for _, r := range []string{"no_credential", "bad_credential", "not_admin"} {
		wantDelta(t, b, a, 1, "rgserver_auth_refused_total", "reason", r)
	}

	// A proxy's token stream: numbers beyond the group's bounds, an
	// unknown group asked twice (etcd is read the first time only).
	tok := pb.NewTokenServiceClient(conn)
	b = scrapeMetrics(t, ts.StatusAddr)
	open := func(id string) (pb.TokenService_AcquireTokensClient, error) {
		st, err := tok.AcquireTokens(bearer("pr0xy-token-0123456789"))
		if err != nil {
			return nil, err
		}
		if err := st.Send(&pb.TokenRequest{ProxyId: id, RequestId: 1, Groups: []*pb.GroupTokenRequest{{Group: "rg_guard", ReportOnly: true}}}); err != nil {
			return nil, err
		}
		_, err = st.Recv()
		return st, err
	}
	st, err := open("counters-1")
	if err != nil {
		t.Fatal(err)
	}
	ask := func(id uint64, gr *pb.GroupTokenRequest) {
		t.Helper()
		if err := st.Send(&pb.TokenRequest{ProxyId: "counters-1", RequestId: id, Groups: []*pb.GroupTokenRequest{gr}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	ask(2, &pb.GroupTokenRequest{Group: "rg_guard", TokensWanted: 1e12, DemandRuPerSec: 1e12})
	ask(3, &pb.GroupTokenRequest{Group: "rg_guard_unknown"})
	ask(4, &pb.GroupTokenRequest{Group: "rg_guard_unknown"})
	if _, err := open("counters-2"); err != nil {
		t.Fatalf("a second stream of a credential allowed two: %v", err)
	}
	if _, err := open("counters-3"); err == nil {
		t.Errorf("a third stream of a credential allowed two was served")
	}
	a = scrapeMetrics(t, ts.StatusAddr)
	wantDelta(t, b, a, 1, "rgserver_token_request_clamped_total", "field", "tokens_wanted")
	wantDelta(t, b, a, 1, "rgserver_token_request_clamped_total", "field", "demand_ru_per_sec")
	wantDelta(t, b, a, 0, "rgserver_token_request_clamped_total", "field", "held_tokens")
	wantDelta(t, b, a, 1, "rgserver_unknown_groups_refused_total", "reason", "cached")
	wantDelta(t, b, a, 0, "rgserver_unknown_groups_refused_total", "reason", "rate_limited")
	wantDelta(t, b, a, 1, "rgserver_auth_refused_total", "reason", "stream_limit")
	if v := a.v("rgserver_insecure"); v != 0 {
		t.Errorf("rgserver_insecure = %v with token files, want 0", v)
	}
}
