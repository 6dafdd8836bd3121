// Package tests drives real processes — MariaDB, rgserver, rgproxy — with
// real clients (go-sql-driver/mysql, the mariadb CLI, sysbench).
package tests

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// backendAddr is the shared MariaDB every machine of this project runs.
const backendAddr = "127.0.0.1:3306"

// binDir holds the binaries TestMain builds once for every test.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rgproxy-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "../cmd/...")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	// The tests' own database on the shared server: tables there are theirs.
	if db, err := sql.Open("mysql", "root@tcp("+backendAddr+")/"); err == nil {
		_, err = db.Exec("CREATE DATABASE IF NOT EXISTS rgproxy_e2e")
		db.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "tests need MariaDB on", backendAddr, "as root:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// handedOut remembers the ports freeAddr returned, so that two calls never
// return the same one (the kernel may offer a just-closed port again
// before the first caller listened on it).
var handedOut = struct {
	sync.Mutex
	ports map[string]bool
}{ports: map[string]bool{}}

// freeAddr returns a loopback address with a port nobody listens on now
// and that no earlier call returned. The port lies below the kernel's
// ephemeral range: a port from that range can be taken, between this
// call and the child's listen, as the local port of any outgoing
// connection on the machine (an etcd member dialling its peers did, and
// the member that was to listen there exited with "address already in
// use").
func freeAddr(t testing.TB) string {
	t.Helper()
	low := ephemeralLow()
	for range 10000 {
		port := 10000 + rand.IntN(low-10000)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		handedOut.Lock()
		dup := handedOut.ports[addr]
		handedOut.ports[addr] = true
		handedOut.Unlock()
		if !dup {
			return addr
		}
	}
	t.Fatalf("no free loopback port between 10000 and %d", low)
	return ""
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (ip_local_port_range), 32768 where it cannot be read or leaves too
// little room below it.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low < 20000 {
		return 32768
	}
	return low
}

// syncBuffer is a goroutine-safe log sink for a child process.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// process is a child process started by a test.
type process struct {
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

func startProcess(t testing.TB, name string, args ...string) *process {
	t.Helper()
	p := &process{log: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binDir, name), args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s %s log:\n%s", name, strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// pause stops the process (SIGSTOP) and returns once every one of its
// threads is stopped: the signal only asks, and on a loaded machine a
// thread already running goes on for a while, long enough to answer a
// request sent "after" the stop.
func (p *process) pause(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.resume)
	task := fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, err := os.ReadDir(task)
		stopped := err == nil && len(ents) > 0
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(task, e.Name(), "stat"))
			// The state follows the parenthesised command name.
			if i := bytes.LastIndexByte(b, ')'); err != nil || i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not stopped 10 s after SIGSTOP", p.cmd.Process.Pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// resume continues a paused process.
func (p *process) resume() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// sessions opens n sessions of db, logged in before the caller times
// anything (on a loaded machine a login can take longer than a test's
// gaps), closed when the test ends.
func sessions(t testing.TB, db *sql.DB, n int) []*sql.Conn {
	t.Helper()
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns
}

// proxy is a running rgproxy.
type proxy struct {
	*process
	Addr, StatusAddr, ConsoleAddr string
}

// defaultConsoleAddr is rgproxy's --console-addr default, where README
// tells a reader to open the console.
const defaultConsoleAddr = "127.0.0.1:10081"

// startProxy runs rgproxy in front of the shared MariaDB on fresh ports
// and waits until it accepts connections.
func startProxy(t testing.TB, extra ...string) *proxy {
	t.Helper()
	return runProxy(t, false, extra...)
}

// runProxy is startProxy; with defaultConsole the console is left at its
// default address (no --console-addr), where only one proxy at a time
// can serve it.
func runProxy(t testing.TB, defaultConsole bool, extra ...string) *proxy {
	t.Helper()
	px := &proxy{Addr: freeAddr(t), StatusAddr: freeAddr(t), ConsoleAddr: defaultConsoleAddr}
	args := []string{"--listen", px.Addr, "--status-addr", px.StatusAddr, "--backend", backendAddr}
	if !defaultConsole {
		px.ConsoleAddr = freeAddr(t)
		args = append(args, "--console-addr", px.ConsoleAddr)
	}
	if !slices.Contains(extra, "--token-server") {
		// A pure proxy unless the test names its rgserver.
		args = append(args, "--metering=false")
	} else if !slices.Contains(extra, "--cache-dir") {
		args = append(args, "--cache-dir", t.TempDir())
	}
	args = append(args, extra...)
	px.process = startProcess(t, "rgproxy", args...)
	waitListening(t, px.Addr, px.process)
	waitListening(t, px.ConsoleAddr, px.process)
	return px
}

func waitListening(t testing.TB, addr string, p *process) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("process exited before listening on %s: %v\n%s", addr, p.err, p.log.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s after 15s\n%s", addr, p.log.String())
}

// dsn builds a go-sql-driver DSN for root at addr.
func dsn(addr string, params ...string) string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = addr
	cfg.DBName = "rgproxy_e2e"
	cfg.Params = map[string]string{}
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "multiStatements":
			cfg.MultiStatements = v == "true"
		case "interpolateParams":
			cfg.InterpolateParams = v == "true"
		case "allowAllFiles":
			cfg.AllowAllFiles = v == "true"
		case "user":
			cfg.User = v
		case "password":
			cfg.Passwd = v
		case "db":
			cfg.DBName = v
		default:
			cfg.Params[k] = v
		}
	}
	return cfg.FormatDSN()
}

func openDB(t testing.TB, addr string, params ...string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn(addr, params...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("ping %s: %v", addr, err)
	}
	return db
}

// rootExec runs statements directly on the shared MariaDB.
func rootExec(t testing.TB, stmts ...string) {
	t.Helper()
	db, err := sql.Open("mysql", dsn(backendAddr, "multiStatements=true"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// httpGet returns the status code and body of a status-port URL.
func httpGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// mysqlErrNo returns the MySQL error number of err, or 0.
func mysqlErrNo(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// requireTool returns the path of an external command a test drives. When
// it is missing the test fails under CI (CI set, as .ci/run does: `make
// test` installs every tool, so a missing one is a broken set-up) and is
// skipped elsewhere, naming the Debian package that provides it.
func requireTool(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s is not installed (apt-get install %s; `make test` installs it): %v", name, pkg, err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// lastStatementRU reads SHOW LAST STATEMENT RU on conn by column name, so
// that a column rgproxy adds later does not break the callers.
func lastStatementRU(t testing.TB, conn interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) map[string]string {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), "SHOW LAST STATEMENT RU")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	out := map[string]string{}
	if !rows.Next() {
		t.Fatalf("SHOW LAST STATEMENT RU: no row (%v)", rows.Err())
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	for i, c := range cols {
		out[c] = vals[i].String
	}
	return out
}

// num parses a numeric column of lastStatementRU.
func num(t testing.TB, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return v
}

// concurrently runs query n times at once on db (which should allow n
// open connections) and returns how long the slowest took from the start.
func concurrently(t *testing.T, db *sql.DB, n int, query string) time.Duration {
	t.Helper()
	var wg sync.WaitGroup
	began := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := db.Exec(query); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return time.Since(began)
}

// repeat runs fn again and again in a goroutine wg waits for, until stop
// is closed or fn returns false: the load loop of many tests.
func repeat(wg *sync.WaitGroup, stop <-chan struct{}, fn func() bool) {
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !fn() {
				return
			}
		}
	})
}

// settingsReach waits, at most 15 s in all, until the settings cache of
// each proxy in to is at from's revision or later (their consoles'
// cache_revision): what was written through from, which its own cache
// shows before the statement returns, has then reached them all. A fixed
// sleep is not enough on a machine whose cores are busy.
func settingsReach(t *testing.T, from *proxy, to ...*proxy) {
	t.Helper()
	revision := func(px *proxy) int64 {
		var c proxyConsoleJSON
		getJSON(t, "http://"+px.ConsoleAddr+"/api/console", &c)
		return c.CacheRevision
	}
	want := revision(from)
	deadline := time.Now().Add(15 * time.Second)
	for _, px := range to {
		watchWaitUntil(t, fmt.Sprintf("proxy %s's settings cache at revision %d", px.Addr, want), time.Until(deadline),
			func() bool { return revision(px) >= want })
	}
}
