package mysqlproto

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/internal/clock"
)

// trickle is a client that has sent avail bytes of what it announced and
// then stalls (io.EOF here): it hands them over chunk bytes at a time.
type trickle struct {
	avail []byte
	chunk int
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.avail) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.chunk)], r.avail)
	r.avail = r.avail[n:]
	return n, nil
}

// TestReadPayloadGrowsWithTheBytesThatCame: a payload announced large
// costs what has arrived (at most twice it, and one small chunk), never
// the announced size, however the bytes trickle in.
func TestReadPayloadGrowsWithTheBytesThatCame(t *testing.T) {
	const announced = 16 << 20
	for _, tc := range []struct {
		name  string
		sent  int
		chunk int
	}{
		{"nothing", 0, 1},
		{"1 KiB", 1 << 10, 100},
		{"one chunk and a byte", growChunk + 1, 7},
		{"100 KiB", 100 << 10, 1460},
		{"3 MiB", 3 << 20, 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &trickle{avail: bytes.Repeat([]byte{'x'}, tc.sent), chunk: tc.chunk}
			buf, err := readPayload(bufio.NewReaderSize(src, clientReadSize), nil, announced, nil)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("err %v, want io.ErrUnexpectedEOF", err)
			}
			if len(buf) != tc.sent {
				t.Fatalf("%d bytes read, %d sent", len(buf), tc.sent)
			}
			if limit := max(growChunk, 2*tc.sent); cap(buf) > limit {
				t.Fatalf("%d bytes of %d announced came: buffer of %d, want <= %d", tc.sent, announced, cap(buf), limit)
			}
		})
	}
	// A payload that comes whole fills the buffer exactly; one that fits
	// the buffer at hand costs no allocation.
	want := bytes.Repeat([]byte("0123456789"), 10000)
	got, err := readPayload(bufio.NewReader(bytes.NewReader(want)), []byte("ab"), len(want), nil)
	if err != nil || !bytes.Equal(got[2:], want) || string(got[:2]) != "ab" {
		t.Fatalf("whole payload: %d bytes, %v", len(got), err)
	}
	reuse := make([]byte, 0, 64)
	br := bufio.NewReader(bytes.NewReader(nil))
	src := bytes.NewReader(nil)
	cmd := []byte("SELECT 1")
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset(cmd)
		br.Reset(src)
		if reuse, err = readPayload(br, reuse[:0], 8, nil); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations reading into a buffer with room", allocs)
	}
}

// TestCommandBufferBudget: sessions are charged for command buffers beyond
// keepBuf, and a growth the budget cannot cover is refused, charging
// nothing; what a session gives back serves the next.
func TestCommandBufferBudget(t *testing.T) {
	b := &memBudget{limit: 256 << 10}
	one, two := &allowance{b: b}, &allowance{b: b}
	if err := one.reserve(keepBuf); err != nil || b.used.Load() != 0 {
		t.Fatalf("a buffer of keepBuf: %v, %d charged", err, b.used.Load())
	}
	src := &trickle{avail: make([]byte, 200<<10), chunk: 1 << 10}
	buf, err := readPayload(bufio.NewReader(src), nil, 1<<20, one)
	if !errors.Is(err, io.ErrUnexpectedEOF) || b.used.Load() != int64(cap(buf)-keepBuf) {
		t.Fatalf("first session: %v, %d charged for a buffer of %d", err, b.used.Load(), cap(buf))
	}
	used := b.used.Load()
	src = &trickle{avail: make([]byte, 200<<10), chunk: 1 << 10}
	buf2, err := readPayload(bufio.NewReader(src), nil, 1<<20, two)
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("second session past the budget: %v after %d bytes", err, len(buf2))
	}
	if got := b.used.Load(); got > b.limit || got != used+two.held {
		t.Fatalf("%d charged (limit %d): the refused growth was charged", got, b.limit)
	}
	one.release()
	two.release()
	if b.used.Load() != 0 {
		t.Fatalf("%d still charged after release", b.used.Load())
	}
	if err := two.reserve(200 << 10); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestDefaultMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		want   int
	}{
		{0, 1},
		{64, 1},
		{256, 58},
		{1024, 298},
		{20000, 6228},
		{1 << 20, 327658},
		{1<<64 - 1, 1 << 30},
	} {
		if got := DefaultMaxConnections(tc.nofile); got != tc.want {
			t.Errorf("DefaultMaxConnections(%d) = %d, want %d", tc.nofile, got, tc.want)
		}
		// What the sessions can use leaves the reserve free.
		if tc.nofile > 200 && tc.nofile < 1<<40 && uint64(3*DefaultMaxConnections(tc.nofile))+64+tc.nofile/16 > tc.nofile {
			t.Errorf("%d descriptors: %d sessions leave no reserve", tc.nofile, DefaultMaxConnections(tc.nofile))
		}
	}
}

func TestPreAuthGate(t *testing.T) {
	g := preAuthGate{byHost: map[netip.Prefix]int{}}
	a := hostKey(&net.TCPAddr{IP: net.ParseIP("192.0.2.1")})
	b := hostKey(&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.2")})
	v6a := hostKey(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1")})
	v6b := hostKey(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9")})
	if v6a != v6b || a == b || a.Bits() != 32 || v6a.Bits() != 64 {
		t.Fatalf("host keys: %v %v %v %v", a, b, v6a, v6b)
	}
	steps := []struct {
		host netip.Prefix
		ok   bool
		why  RefusalReason
	}{
		{a, true, 0}, {a, true, 0}, {a, false, RefusedUnauthenticatedPerHost},
		{b, true, 0}, {v6a, false, RefusedUnauthenticated}, // 3 in all
	}
	for i, s := range steps {
		why, ok := g.enter(s.host, 3, 2)
		if ok != s.ok || !ok && why != s.why {
			t.Fatalf("step %d (%v): ok %v %v, want %v %v", i, s.host, ok, why, s.ok, s.why)
		}
	}
	g.leave(a)
	if _, ok := g.enter(v6b, 3, 2); !ok || g.count() != 3 {
		t.Fatalf("after one left: refused, %d counted", g.count())
	}
	for _, h := range []netip.Prefix{a, b, v6a} {
		g.leave(h)
	}
	if g.count() != 0 || len(g.byHost) != 0 {
		t.Fatalf("%d counted, %v left", g.count(), g.byHost)
	}
}

// recordHandler keeps log records.
type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordHandler) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.Key + "=" + a.Value.String())
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// TestLogLimiter: a flood of events costs one line at once and one summary
// a period later; a lone event after a quiet period is logged at once.
func TestLogLimiter(t *testing.T) {
	h := &recordHandler{}
	clk := clock.NewFake()
	l := newLogLimiter(slog.New(h), clk, slog.LevelWarn, "client protocol error", "client protocol errors", "kind")
	for i := range 2000 {
		k := "bad_handshake"
		if i%4 == 0 {
			k = "out_of_order"
		}
		l.event(k, "client", "192.0.2.1:4000", "n", i)
		if i == 1000 {
			clk.Advance(300 * time.Millisecond)
		}
	}
	if got := h.lines(); len(got) != 1 || got[0] != "client protocol error kind=out_of_order client=192.0.2.1:4000 n=0" {
		t.Fatalf("after the flood: %q", got)
	}
	clk.Advance(700 * time.Millisecond)
	waitFor(t, func() bool { return len(h.lines()) == 2 }) // the summary is written by the timer's goroutine
	want := "client protocol errors count=1999 kinds=bad_handshake=1500 out_of_order=499 last_client=192.0.2.1:4000 last_n=1999"
	if got := h.lines(); len(got) != 2 || got[1] != want {
		t.Fatalf("after a second: %q\nwant %q", got, want)
	}
	clk.Advance(5 * time.Second)
	l.event("too_large", "client", "192.0.2.9:1")
	if got := h.lines(); len(got) != 3 || !strings.HasPrefix(got[2], "client protocol error kind=too_large") {
		t.Fatalf("a lone event later: %q", got)
	}
	l.event("too_large", "client", "192.0.2.9:2")
	l.stop()
	if got := h.lines(); len(got) != 4 || !strings.Contains(got[3], "count=1") {
		t.Fatalf("stop writes what is pending: %q", got)
	}
}

// dialCountingBackend is a backend that greets every connection, accepts
// any login and answers every command with OK; it counts connections.
func dialCountingBackend(t *testing.T) (addr string, dials *atomic.Int64) {
	t.Helper()
	dials = new(atomic.Int64)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	greeting := mariaGreeting(mysql.CLIENT_PROTOCOL_41|mysql.CLIENT_SECURE_CONNECTION|mysql.CLIENT_PLUGIN_AUTH, 0, "mysql_native_password")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			go func() {
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				_, _ = writeMessage(bw, 0, greeting)
				_ = bw.Flush()
				_, seq, err := readMessage(br, nil, 1<<20)
				if err != nil {
					return
				}
				_, _ = writeMessage(bw, seq+1, okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
				_ = bw.Flush()
				var cmd []byte
				for {
					if cmd, _, err = readMessage(br, cmd, 1<<30); err != nil || len(cmd) == 0 || cmd[0] == mysql.COM_QUIT {
						return
					}
					_, _ = writeMessage(bw, 1, okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
					_ = bw.Flush()
				}
			}()
		}
	}()
	return ln.Addr().String(), dials
}

// greeted connects from local (nil: any loopback address) and reads the
// greeting or the ERR in its place.
func greeted(t *testing.T, addr string, local net.IP) (net.Conn, *bufio.Reader, []byte) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != nil {
		d.LocalAddr = &net.TCPAddr{IP: local}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	p, _, err := readMessage(br, nil, 1<<20)
	if err != nil {
		t.Fatalf("first packet: %v", err)
	}
	return c, br, p
}

// TestUnauthenticatedConnectionsBounded: beyond MaxUnauthenticated (and
// per host) a connection gets 1040 at once and the backend never hears of
// it; a login that completes frees its place.
func TestUnauthenticatedConnectionsBounded(t *testing.T) {
	be, dials := dialCountingBackend(t)
	s, addr := startProxy(t, Config{BackendAddr: be, MaxUnauthenticated: 3, MaxUnauthenticatedPerHost: 2})
	is1040 := func(p []byte) bool {
		e := parseErrPacket(p)
		return len(p) > 0 && p[0] == mysql.ERR_HEADER && e.Code == mysql.ER_CON_COUNT_ERROR && e.State == "08004"
	}
	one := net.ParseIP("127.0.0.2")
	c1, br1, g1 := greeted(t, addr, one)
	_, _, g2 := greeted(t, addr, one)
	if is1040(g1) || is1040(g2) {
		t.Fatal("the first two were refused")
	}
	if _, _, p := greeted(t, addr, one); !is1040(p) {
		t.Fatalf("third from one host: %q, want 1040", p)
	}
	if _, _, p := greeted(t, addr, net.ParseIP("127.0.0.3")); is1040(p) {
		t.Fatal("another host refused below the total")
	}
	if _, _, p := greeted(t, addr, net.ParseIP("127.0.0.4")); !is1040(p) {
		t.Fatalf("fourth in all: %q, want 1040", p)
	}
	if n := dials.Load(); n != 3 {
		t.Fatalf("%d backend connections for 3 admitted", n)
	}
	st := s.Stats()
	if st.Refused[RefusedUnauthenticatedPerHost] != 1 || st.Refused[RefusedUnauthenticated] != 1 || st.Unauthenticated != 3 {
		t.Fatalf("stats: refused %v, unauthenticated %d", st.Refused, st.Unauthenticated)
	}
	// The first logs in: its place is free for someone else.
	caps := mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH
	login := wirePacket(handshakeResp(caps, "root", nil, "", "mysql_native_password", false))
	login[3] = 1
	if _, err := c1.Write(login); err != nil {
		t.Fatal(err)
	}
	if p, _, err := readMessage(br1, nil, 1<<20); err != nil || p[0] != mysql.OK_HEADER {
		t.Fatalf("login: %q %v", p, err)
	}
	if _, _, p := greeted(t, addr, one); is1040(p) {
		t.Fatal("refused after a place was freed")
	}
	if st := s.Stats(); st.Unauthenticated != 3 || st.Connections != 4 {
		t.Fatalf("after the login: %d unauthenticated, %d connections", st.Unauthenticated, st.Connections)
	}
}

// TestStalledCommandTimesOut: a client that sends part of a command and
// then nothing gets 1159 after NetReadTimeout and is closed, as from
// MariaDB's net_read_timeout.
func TestStalledCommandTimesOut(t *testing.T) {
	be, _ := dialCountingBackend(t)
	s, addr := startProxy(t, Config{BackendAddr: be, NetReadTimeout: 100 * time.Millisecond})
	c, br, _ := greeted(t, addr, nil)
	caps := mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH
	login := wirePacket(handshakeResp(caps, "root", nil, "", "mysql_native_password", false))
	login[3] = 1
	c.Write(login)
	if p, _, err := readMessage(br, nil, 1<<20); err != nil || p[0] != mysql.OK_HEADER {
		t.Fatalf("login: %q %v", p, err)
	}
	// An idle session is not timed out.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	time.Sleep(300 * time.Millisecond)
	c.Write(wirePacket(query("SELECT 1")))
	if p, _, err := readMessage(br, nil, 1<<20); err != nil || p[0] != mysql.OK_HEADER {
		t.Fatalf("after idling: %q %v", p, err)
	}
	start := time.Now()
	c.Write([]byte{100, 0, 0, 0, mysql.COM_QUERY, 'S', 'E', 'L'})
	p, seq, err := readMessage(br, nil, 1<<20)
	took := time.Since(start)
	if err != nil || parseErrPacket(p).Code != mysql.ER_NET_READ_INTERRUPTED || seq != 1 {
		t.Fatalf("stalled command: %q seq %d, %v", p, seq, err)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("connection still open")
	}
	if took < 100*time.Millisecond || took > 100*time.Millisecond+deadlineSlack+time.Second {
		t.Fatalf("timed out after %v", took)
	}
	if n := s.Stats().ProtocolErrors[ProtoReadTimeout]; n != 1 {
		t.Fatalf("%d read timeouts counted", n)
	}
}

// TestCommandBufferLimitRefusesTheOneThatGrows: with a budget of 256 KiB,
// a session that holds 150 KiB of a large statement goes on, the one that
// would take the proxy past the budget gets 1041, and what the first held
// is given back when its statement is over.
func TestCommandBufferLimitRefusesTheOneThatGrows(t *testing.T) {
	be, _ := dialCountingBackend(t)
	s, addr := startProxy(t, Config{BackendAddr: be, CommandBufferLimit: 256 << 10})
	caps := mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH
	login := wirePacket(handshakeResp(caps, "root", nil, "", "mysql_native_password", false))
	login[3] = 1
	session := func() (net.Conn, *bufio.Reader) {
		c, br, _ := greeted(t, addr, nil)
		c.Write(login)
		if p, _, err := readMessage(br, nil, 1<<20); err != nil || p[0] != mysql.OK_HEADER {
			t.Fatalf("login: %q %v", p, err)
		}
		return c, br
	}
	big := wirePacket(query("SELECT '" + strings.Repeat("x", 200<<10) + "'"))
	c1, br1 := session()
	c1.Write(big[:150<<10])
	waitFor(t, func() bool { return s.Stats().CommandBufferBytes > 100<<10 })
	c2, br2 := session()
	c2.Write(big)
	p, _, err := readMessage(br2, nil, 1<<20)
	if err != nil || parseErrPacket(p).Code != mysql.ER_OUT_OF_RESOURCES {
		t.Fatalf("second session: %q, %v", p, err)
	}
	c1.Write(big[150<<10:])
	if p, _, err := readMessage(br1, nil, 1<<20); err != nil || p[0] != mysql.OK_HEADER {
		t.Fatalf("first session's statement: %q, %v", p, err)
	}
	waitFor(t, func() bool { return s.Stats().CommandBufferBytes == 0 })
	if n := s.Stats().ProtocolErrors[ProtoBufferLimit]; n != 1 {
		t.Fatalf("%d refusals counted", n)
	}
}

// emfileListener fails its next Accept with EMFILE, as a process out of
// descriptors sees it, then accepts for real.
type emfileListener struct {
	net.Listener
	fail atomic.Int64
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fail.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptOutOfDescriptorsRefuses: when accept fails for want of
// descriptors, the client waiting in the backlog gets 1040 (rgproxy gives
// up a spare descriptor for it) instead of hanging, and the server goes
// on serving.
func TestAcceptOutOfDescriptorsRefuses(t *testing.T) {
	be, dials := dialCountingBackend(t)
	s, err := NewServer(Config{BackendAddr: be, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &emfileListener{Listener: inner}
	ln.fail.Store(1) // the first Accept fails
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	addr := inner.Addr().String()
	_, _, p := greeted(t, addr, nil)
	if e := parseErrPacket(p); p[0] != mysql.ERR_HEADER || e.Code != mysql.ER_CON_COUNT_ERROR {
		t.Fatalf("client accepted on a spare descriptor: %q, want 1040", p)
	}
	if _, _, p := greeted(t, addr, nil); p[0] != 10 {
		t.Fatalf("after: %q", p)
	}
	if n := s.Stats().Refused[RefusedDescriptors]; n != 1 || dials.Load() != 1 {
		t.Fatalf("%d refused for descriptors, %d backend dials", n, dials.Load())
	}
}
