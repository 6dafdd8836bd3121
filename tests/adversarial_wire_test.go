package tests

import (
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"
)

// Hostile clients on rgproxy's MySQL port: each test here runs one attack
// against real processes and checks that it fails.

// rawCaps are the capabilities of the tests' hand-made handshake response.
const rawCaps = gomysql.CLIENT_LONG_PASSWORD | gomysql.CLIENT_PROTOCOL_41 | gomysql.CLIENT_SECURE_CONNECTION |
	gomysql.CLIENT_PLUGIN_AUTH | gomysql.CLIENT_TRANSACTIONS

// writeRaw writes one packet.
func writeRaw(c net.Conn, seq byte, payload []byte) error {
	h := []byte{byte(len(payload)), byte(len(payload) >> 8), byte(len(payload) >> 16), seq}
	_, err := c.Write(append(h, payload...))
	return err
}

// readRaw reads one packet.
func readRaw(r io.Reader) (seq byte, payload []byte, err error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(h[0]) | int(h[1])<<8 | int(h[2])<<16
	payload = make([]byte, n)
	_, err = io.ReadFull(r, payload)
	return h[3], payload, err
}

// handshakeResponse41 is root's answer to a greeting, with an empty
// password.
func handshakeResponse41() []byte {
	p := binary.LittleEndian.AppendUint32(nil, rawCaps)
	p = binary.LittleEndian.AppendUint32(p, 1<<24)
	p = append(p, 45)
	p = append(p, make([]byte, 23)...)
	p = append(p, "root\x00"...)
	p = append(p, 0) // no auth data
	return append(p, "mysql_native_password\x00"...)
}

// rawLogin logs in as root (empty password) over a hand-made connection.
func rawLogin(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, g, err := readRaw(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting: %w", err)
	} else if _, _, msg, ok := rawErr(g); ok {
		c.Close()
		return nil, fmt.Errorf("refused in place of the greeting: %s", msg)
	}
	if err := writeRaw(c, 1, handshakeResponse41()); err != nil {
		c.Close()
		return nil, err
	}
	_, p, err := readRaw(c)
	if err != nil || len(p) == 0 || p[0] != gomysql.OK_HEADER {
		c.Close()
		return nil, fmt.Errorf("login answer %q: %v", p, err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// rawErr decodes an ERR packet's code, SQLSTATE and message.
func rawErr(p []byte) (code uint16, state, msg string, ok bool) {
	if len(p) < 9 || p[0] != gomysql.ERR_HEADER || p[3] != '#' {
		return 0, "", "", false
	}
	return binary.LittleEndian.Uint16(p[1:3]), string(p[4:9]), string(p[9:]), true
}

// procStatusKB reads a field of /proc/<pid>/status, in KiB.
func procStatusKB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// proxyMemory is rgproxy's resident set and Go heap in use, in bytes.
func proxyMemory(t testing.TB, px *proxy) (rss, heap int64) {
	t.Helper()
	return procStatusKB(t, px.cmd.Process.Pid, "VmRSS") << 10,
		int64(metricSum(t, px.StatusAddr, "go_memstats_heap_inuse_bytes"))
}

// openMany opens n connections with open, a few at a time (the way a
// pool fills up), and closes them at the end of the test.
func openMany(t testing.TB, n, parallel int, open func() (net.Conn, error)) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				c, err := open()
				if err != nil {
					failed.Store(fmt.Errorf("connection %d: %w", i, err))
					return
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}
	return conns
}

// TestHostileClients runs the attacks on rgproxy's MySQL port against one
// private MariaDB (its max_connections is set for each).
func TestHostileClients(t *testing.T) {
	db := startPrivateMariaDB(t)
	t.Run("stalled packets cost little", func(t *testing.T) { stalledPacketsCostLittle(t, db) })
	t.Run("connections that never log in", func(t *testing.T) { neverLoggingInHurtsNoOne(t, db) })
	t.Run("malformed handshakes", func(t *testing.T) { malformedHandshakesAnswered(t, db) })
	t.Run("256 file descriptors", func(t *testing.T) { fewDescriptorsStillServe(t, db) })
}

// stalledPacketsCostLittle: 1,000 clients each announce a large
// packet, send 1 KiB of it and stall: logged-in clients a 16 MiB
// COM_QUERY, clients still logging in a 1 MiB handshake response (the
// largest rgproxy takes there; the same buffer code reads both). rgproxy
// holds memory for the bytes that came, not for the bytes announced: its
// resident set and Go heap grow by less than 64 MiB for the 1,000
// connections and their stalled packets together.
func stalledPacketsCostLittle(t *testing.T, db *privateMariaDB) {
	const sessions = 1000
	const bound = 64 << 20
	db.exec(t, "SET GLOBAL max_connections = 1200")
	// stalled is 1 KiB of a packet whose header announces size bytes.
	stalled := func(size int, seq byte, start []byte) []byte {
		b := make([]byte, 4+1024)
		copy(b, []byte{byte(size), byte(size >> 8), byte(size >> 16), seq})
		for i := 4 + copy(b[4:], start); i < len(b); i++ {
			b[i] = 'x'
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		flags []string
		// open returns a connection that has sent its stalled packet.
		open func(addr string) (net.Conn, error)
	}{
		{"16 MiB COM_QUERY after login", nil, func(addr string) (net.Conn, error) {
			c, err := rawLogin(addr)
			if err == nil {
				_, err = c.Write(stalled(1<<24-1, 0, []byte{gomysql.COM_QUERY, 'S', 'E', 'L', 'E', 'C', 'T', ' ', '\''}))
			}
			return c, err
		}},
		{"1 MiB handshake response", []string{"--max-unauthenticated", "2000", "--max-unauthenticated-per-host", "2000"},
			func(addr string) (net.Conn, error) {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					return nil, err
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, _, err := readRaw(c); err != nil {
					c.Close()
					return nil, fmt.Errorf("greeting: %w", err)
				}
				_, err = c.Write(stalled(1<<20, 1, handshakeResponse41()[:32]))
				return c, err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := startProxy(t, append([]string{"--backend", db.Addr, "--log-level", "warn"}, tc.flags...)...)
			rss0, heap0 := proxyMemory(t, px)
			start := time.Now()
			for done := 0; done < sessions; done += 100 {
				openMany(t, 100, 8, func() (net.Conn, error) { return tc.open(px.Addr) })
				// Stop early rather than push a broken proxy into swap.
				if rss, heap := proxyMemory(t, px); rss-rss0 > 4*bound || heap-heap0 > 4*bound {
					t.Fatalf("after %d stalled packets rgproxy grew by %d MiB resident, %d MiB of heap",
						done+100, (rss-rss0)>>20, (heap-heap0)>>20)
				}
			}
			// Let the proxy read what was sent.
			time.Sleep(500 * time.Millisecond)
			rss, heap := proxyMemory(t, px)
			t.Logf("%d connections with a stalled packet in %v: rgproxy resident %d -> %d MiB (+%.1f), heap in use %d -> %d MiB (+%.1f)",
				sessions, time.Since(start).Round(time.Millisecond), rss0>>20, rss>>20, float64(rss-rss0)/(1<<20),
				heap0>>20, heap>>20, float64(heap-heap0)/(1<<20))
			if rss-rss0 >= bound || heap-heap0 >= bound {
				t.Fatalf("1,000 stalled packets cost rgproxy %d MiB resident, %d MiB of heap; want < 64 MiB",
					(rss-rss0)>>20, (heap-heap0)>>20)
			}
			if n := metricSum(t, px.StatusAddr, "rgproxy_connections"); n != sessions {
				t.Fatalf("rgproxy_connections = %v, want %d: connections were dropped", n, sessions)
			}
		})
	}
}

// backendThreads is the backend's Threads_connected; ok is false while
// the backend answers 1040 (connections an earlier subtest closed that it
// has not let go of yet).
func backendThreads(t *testing.T, db *privateMariaDB) (n int, ok bool) {
	t.Helper()
	conn, err := sql.Open("mysql", dsn(db.Addr, "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var name string
	if err := conn.QueryRow("SHOW STATUS LIKE 'Threads_connected'").Scan(&name, &n); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1040 {
			return 0, false
		}
		t.Fatal(err)
	}
	return n, true
}

// settle waits until the backend has closed what earlier subtests left.
func settle(t *testing.T, db *privateMariaDB) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		n, ok := backendThreads(t, db)
		if ok && n <= 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backend still has %d connections (answering: %v)", n, ok)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logLines counts the lines of a process's log that contain sub.
func logLines(p *process, sub string) int {
	n := 0
	for _, l := range strings.Split(p.log.String(), "\n") {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// neverLoggingInHurtsNoOne: 1,000 TCP connections that never log in,
// against rgproxy with its defaults in front of a MariaDB with its default
// max_connections (151). Directly, that many would fill the backend and
// make it answer 1040 to everyone for connect_timeout; through rgproxy
// only a bounded number reach the backend (the rest get 1040 from rgproxy
// at once), so a direct client of the backend still logs in, a session
// logged in through rgproxy still runs statements, /readyz answers 200 in
// under 100 ms, and rgproxy's log says so about once a second.
func neverLoggingInHurtsNoOne(t *testing.T, db *privateMariaDB) {
	const flood = 1000
	settle(t, db) // before any login: the last subtest's connections may still fill the backend
	db.exec(t, "SET GLOBAL max_connections = 151",
		"CREATE USER IF NOT EXISTS 'plain'@'%' IDENTIFIED BY 'plain-pw-1'", "GRANT SELECT ON mysql.* TO 'plain'@'%'")
	settle(t, db)
	px := startProxy(t, "--backend", db.Addr)
	app := openDB(t, px.Addr, "db=mysql")
	app.SetMaxOpenConns(1)
	if _, err := app.Exec("SELECT 1"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var refused, greeted, other atomic.Int64
	conns := openMany(t, flood, 16, func() (net.Conn, error) {
		c, err := net.DialTimeout("tcp", px.Addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, p, err := readRaw(c)
			switch code, _, _, ok := rawErr(p); {
			case err == nil && ok && code == gomysql.ER_CON_COUNT_ERROR:
				refused.Add(1)
			case err == nil && len(p) > 0 && p[0] == 10:
				greeted.Add(1)
			default:
				other.Add(1)
			}
		}()
		return c, nil
	})
	opened := time.Since(start)

	// Directly, a user without SUPER still gets in.
	direct, err := sql.Open("mysql", dsn(db.Addr, "user=plain", "password=plain-pw-1", "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if err := direct.Ping(); err != nil {
		t.Fatalf("a direct client of the backend during the flood: %v", err)
	}
	// The session logged in through rgproxy goes on.
	for range 10 {
		if _, err := app.Exec("SELECT 1"); err != nil {
			t.Fatalf("a logged-in session through rgproxy during the flood: %v", err)
		}
	}
	// /readyz answers, and fast.
	var slowest time.Duration
	for range 5 {
		t0 := time.Now()
		code, body := httpGet(t, "http://"+px.StatusAddr+"/readyz")
		slowest = max(slowest, time.Since(t0))
		if code != 200 {
			t.Fatalf("/readyz during the flood: %d %s", code, body)
		}
	}
	if slowest >= 100*time.Millisecond {
		t.Fatalf("/readyz took %v during the flood, want < 100ms", slowest)
	}
	threads, _ := backendThreads(t, db)
	for deadline := time.Now().Add(5 * time.Second); refused.Load()+greeted.Load()+other.Load() < flood && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	lines := logLines(px.process, "refused")
	t.Logf("%d connections opened in %v: %d refused with 1040 by rgproxy, %d greeted, %d other; backend connections %d; "+
		"/readyz slowest %v; %d log lines about refusals in %v",
		flood, opened.Round(time.Millisecond), refused.Load(), greeted.Load(), other.Load(), threads,
		slowest.Round(100*time.Microsecond), lines, elapsed.Round(time.Millisecond))
	if refused.Load() < flood-64 {
		t.Errorf("only %d of %d connections that never log in were refused", refused.Load(), flood)
	}
	if n := metricSum(t, px.StatusAddr, "rgproxy_connections_refused_total"); n != float64(refused.Load()) {
		t.Errorf("rgproxy_connections_refused_total = %v, %d refusals seen", n, refused.Load())
	}
	if max := int(elapsed/time.Second) + 2; lines > max {
		t.Errorf("%d log lines about refusals in %v, want at most %d:\n%s", lines, elapsed, max, px.log.String())
	}
	_ = conns
}

// handshakeCases are broken handshake responses: what MariaDB 10.11
// answers to each (code, SQLSTATE, sequence id), and rgproxy must too.
var handshakeCases = []struct {
	name string
	wire []byte
}{
	{"too short", []byte{2, 0, 0, 1, 0x85, 0xa6}},
	{"empty", []byte{0, 0, 0, 1}},
	{"out of order", append([]byte{byte(len(handshakeResponse41())), 0, 0, 0}, handshakeResponse41()...)},
	{"not MySQL", []byte("GET / HTTP/1.1\r\nHost: db\r\n\r\n")},
	{"user not terminated", append([]byte{36, 0, 0, 1}, append(handshakeResponse41()[:32], "root"...)...)},
	{"SSL request, no TLS", append([]byte{32, 0, 0, 1}, append(binary.LittleEndian.AppendUint32(nil, rawCaps|gomysql.CLIENT_SSL), make([]byte, 28)...)...)},
}

// handshakeAnswer sends wire after the greeting and returns the ERR's
// code, SQLSTATE and sequence id, and whether the connection then closed.
func handshakeAnswer(addr string, wire []byte) (code uint16, state string, seq byte, closed bool, err error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, "", 0, false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := readRaw(c); err != nil {
		return 0, "", 0, false, fmt.Errorf("greeting: %w", err)
	}
	if _, err := c.Write(wire); err != nil {
		return 0, "", 0, false, err
	}
	seq, p, err := readRaw(c)
	if err != nil {
		return 0, "", 0, false, fmt.Errorf("answer: %w", err)
	}
	code, state, _, ok := rawErr(p)
	if !ok {
		return 0, "", 0, false, fmt.Errorf("answer %q is not an ERR", p)
	}
	var one [1]byte
	_, rerr := c.Read(one[:])
	return code, state, seq, rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded), nil
}

// malformedHandshakesAnswered: each broken handshake response gets, from
// rgproxy, the ERR MariaDB sends for it (1043 Bad handshake, 1156 Got
// packets out of order), then the connection closes; 2,000 of them are
// counted in rgproxy_protocol_errors_total and cost a log line a second.
func malformedHandshakesAnswered(t *testing.T, db *privateMariaDB) {
	settle(t, db)
	db.exec(t, "SET GLOBAL max_connections = 151")
	px := startProxy(t, "--backend", db.Addr)
	for _, tc := range handshakeCases {
		dc, ds, dseq, dclosed, err := handshakeAnswer(db.Addr, tc.wire)
		if err != nil {
			t.Fatalf("%s, directly: %v", tc.name, err)
		}
		pc, ps, pseq, pclosed, err := handshakeAnswer(px.Addr, tc.wire)
		if err != nil {
			t.Fatalf("%s, through rgproxy: %v", tc.name, err)
		}
		t.Logf("%s: MariaDB %d (%s) seq %d closed %v; rgproxy %d (%s) seq %d closed %v", tc.name, dc, ds, dseq, dclosed, pc, ps, pseq, pclosed)
		if pc != dc || ps != ds || pseq != dseq || !pclosed {
			t.Errorf("%s: rgproxy answers %d (%s) with sequence id %d, closed %v; MariaDB %d (%s) with %d",
				tc.name, pc, ps, pseq, pclosed, dc, ds, dseq)
		}
	}
	const storm = 2000
	start := time.Now()
	var wrong atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= storm {
				tc := handshakeCases[int(next.Load())%len(handshakeCases)]
				if code, _, _, _, err := handshakeAnswer(px.Addr, tc.wire); err != nil ||
					code != gomysql.ER_HANDSHAKE_ERROR && code != gomysql.ER_NET_PACKETS_OUT_OF_ORDER {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	time.Sleep(1100 * time.Millisecond) // the last summary line
	counted := metricSum(t, px.StatusAddr, "rgproxy_protocol_errors_total")
	lines := logLines(px.process, "protocol error")
	t.Logf("%d broken handshakes in %v: %d not answered with 1043 or 1156; %v counted; %d log lines",
		storm, elapsed.Round(time.Millisecond), wrong.Load(), counted, lines)
	if wrong.Load() != 0 {
		t.Errorf("%d of %d broken handshakes not answered with MariaDB's ERR", wrong.Load(), storm)
	}
	if want := float64(storm + len(handshakeCases)); counted != want {
		t.Errorf("rgproxy_protocol_errors_total = %v, want %v", counted, want)
	}
	if max := int(elapsed/time.Second) + 3; lines > max {
		t.Errorf("%d log lines about protocol errors in %v, want at most %d", lines, elapsed, max)
	}
}

// TestPprofOffByDefault: the status port serves no profiles unless
// --enable-pprof asks for them.
func TestPprofOffByDefault(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  int
	}{{nil, 404}, {[]string{"--enable-pprof"}, 200}} {
		px := startProxy(t, tc.flags...)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap"} {
			if code, _ := httpGet(t, "http://"+px.StatusAddr+path); code != tc.want {
				t.Errorf("%v: GET %s = %d, want %d", tc.flags, path, code, tc.want)
			}
		}
	}
}

// startProxyWithNofile runs rgproxy as startProxy does, under a limit of
// nofile open file descriptors (soft and hard).
func startProxyWithNofile(t *testing.T, nofile int, extra ...string) *proxy {
	t.Helper()
	px := &proxy{Addr: freeAddr(t), StatusAddr: freeAddr(t)}
	args := append([]string{"--listen", px.Addr, "--status-addr", px.StatusAddr, "--metering=false"}, extra...)
	p := &process{log: &syncBuffer{}, done: make(chan struct{})}
	script := fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile)
	p.cmd = exec.Command("sh", append([]string{"-c", script, filepath.Join(binDir, "rgproxy")}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(10 * time.Second)
		if t.Failed() {
			t.Logf("rgproxy log:\n%s", p.log.String())
		}
	})
	px.process = p
	waitListening(t, px.Addr, p)
	return px
}

// fewDescriptorsStillServe: rgproxy under a limit of 256 file descriptors,
// and 200 clients that log in, 8 at a time. Without a ceiling the sessions
// take every descriptor: accept fails with EMFILE (a log line each time),
// logins hang and /readyz cannot dial. With the ceiling derived from the
// limit, the clients beyond it get 1040 at once, those within it work,
// /readyz answers in under 100 ms and accept never fails.
func fewDescriptorsStillServe(t *testing.T, db *privateMariaDB) {
	const nofile, clients = 256, 200
	settle(t, db)
	db.exec(t, "SET GLOBAL max_connections = 400")
	px := startProxyWithNofile(t, nofile, "--backend", db.Addr)
	var refused, in atomic.Int64
	var slowest atomic.Int64
	conns := openMany(t, clients, 8, func() (net.Conn, error) {
		t0 := time.Now()
		c, err := rawLogin(px.Addr)
		if d := int64(time.Since(t0)); d > slowest.Load() {
			slowest.Store(d)
		}
		if err != nil {
			if !strings.Contains(err.Error(), "Too many connections") {
				return nil, err
			}
			refused.Add(1)
			return nil, nil
		}
		in.Add(1)
		return c, nil
	})
	var t0 = time.Now()
	code, body := httpGet(t, "http://"+px.StatusAddr+"/readyz")
	ready := time.Since(t0)
	limit := metricSum(t, px.StatusAddr, "rgproxy_max_connections")
	t.Logf("%d descriptors: max_connections %v; %d clients logged in, %d refused with 1040, slowest login %v; /readyz %d in %v",
		nofile, limit, in.Load(), refused.Load(), time.Duration(slowest.Load()).Round(time.Millisecond), code, ready.Round(100*time.Microsecond))
	if code != 200 || ready >= 100*time.Millisecond {
		t.Errorf("/readyz: %d %s in %v", code, body, ready)
	}
	if in.Load() == 0 || float64(in.Load()) > limit || in.Load()+refused.Load() != clients {
		t.Errorf("%d in, %d refused of %d, limit %v", in.Load(), refused.Load(), clients, limit)
	}
	if time.Duration(slowest.Load()) > 2*time.Second {
		t.Errorf("a login took %v", time.Duration(slowest.Load()))
	}
	if n := logLines(px.process, "accept failed"); n != 0 {
		t.Errorf("%d accept failures logged", n)
	}
	for _, c := range conns {
		if c == nil {
			continue
		}
		if err := writeRaw(c, 0, []byte{gomysql.COM_PING}); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, p, err := readRaw(c); err != nil || len(p) == 0 || p[0] != gomysql.OK_HEADER {
			t.Fatalf("a logged-in session: %q %v", p, err)
		}
		break
	}
}
