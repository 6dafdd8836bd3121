package mysqlproto

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	sqldriver "github.com/go-sql-driver/mysql"
)

func TestBackendUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, addr := startProxy(t, Config{BackendAddr: dead, DialTimeout: time.Second})
	db := openDB(t, addr)
	err = db.Ping()
	var me *sqldriver.MySQLError
	if !errors.As(err, &me) || me.Number != errCodeBackendUnreachable || !strings.Contains(me.Message, dead) ||
		!strings.Contains(me.Message, "refused") {
		t.Fatalf("got %v", err)
	}
	if s.Stats().BackendErrors == 0 {
		t.Error("backend error not counted")
	}
	if err := ProbeBackend(context.Background(), Config{BackendAddr: dead}); err == nil {
		t.Error("ProbeBackend of a dead address succeeded")
	}
}

// A backend that accepts and closes at once (a load balancer with no
// healthy server behind it): the client still hears 9001 and why, though
// the backend poller saw the close while the login was "idle".
func TestBackendAcceptsThenCloses(t *testing.T) {
	ln := serveTCP(t, func(c net.Conn) {
		time.Sleep(50 * time.Millisecond) // the proxy is waiting for the greeting
		c.Close()
	})
	_, addr := startProxy(t, Config{BackendAddr: ln.Addr().String(), DialTimeout: time.Second})
	db := openDB(t, addr)
	for range 5 {
		err := db.Ping()
		var me *sqldriver.MySQLError
		if !errors.As(err, &me) || me.Number != errCodeBackendUnreachable || !strings.Contains(me.Message, "greeting") {
			t.Fatalf("got %v, want 9001 naming the greeting", err)
		}
	}
}

// cutProxy is a TCP relay in front of the backend whose connections the
// test can cut, to lose the backend mid-session.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T) *cutProxy {
	cp := &cutProxy{}
	t.Cleanup(cp.cut) // after serveTCP's close of the listener: nothing new to relay
	cp.ln = serveTCP(t, func(c net.Conn) {
		b, err := net.Dial("tcp", backendAddr)
		if err != nil {
			c.Close()
			return
		}
		cp.mu.Lock()
		cp.conns = append(cp.conns, c, b)
		cp.mu.Unlock()
		go func() { io.Copy(b, c); b.Close() }()
		go func() { io.Copy(c, b); c.Close() }()
	})
	return cp
}

func (cp *cutProxy) cut() { cp.cutWith(nil) }

// lingerZero makes the next cut a reset (RST) of rgproxy's side rather
// than a close (FIN).
func (cp *cutProxy) lingerZero() {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i, c := range cp.conns {
		if i%2 == 0 {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
	}
}

// cutWith writes p to rgproxy's side of every relayed connection (as the
// backend's last words), then cuts them.
func (cp *cutProxy) cutWith(p []byte) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i, c := range cp.conns {
		if i%2 == 0 && p != nil {
			_, _ = c.Write(p)
		}
		c.Close()
	}
	cp.conns = nil
}

// A backend that closes an idle session (wait_timeout, KILL, a restart)
// closes the client at once, with nothing sent; other sessions go on.
func TestBackendClosesIdleSession(t *testing.T) {
	setupSchema(t)
	cp := newCutProxy(t)
	s, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String()})
	victim := dialRaw(t, addr, "root", "")
	if _, m := victim.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("ping failed")
	}
	_, good := startProxy(t, Config{})
	other := dialRaw(t, good, "root", "")
	cp.cut()
	start := time.Now()
	victim.expectClosed()
	if d := time.Since(start); d > time.Second {
		t.Errorf("client closed %v after its backend", d)
	}
	if st := s.Stats(); st.BackendErrors != 0 {
		t.Errorf("an idle close counted as a backend error: %+v", st)
	}
	waitFor(t, func() bool { return s.Stats().Connections == 0 })
	if _, m := other.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("other session affected")
	}
}

// MariaDB resets the connection on wait_timeout: the client's is reset
// too, so that its next write fails as it would directly.
func TestBackendResetMirrored(t *testing.T) {
	setupSchema(t)
	cp := newCutProxy(t)
	_, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String()})
	victim := dialRaw(t, addr, "root", "")
	// An idle session: its login and first command are over.
	if _, m := victim.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("ping failed")
	}
	cp.lingerZero()
	cp.cut()
	_ = victim.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := victim.br.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read %v, want a reset", err)
	}
}

// MySQL 8 sends ERR 4031 before it closes a session on wait_timeout:
// the client gets that packet as it came, then the close.
func TestBackendErrRelayedOnIdleClose(t *testing.T) {
	setupSchema(t)
	cp := newCutProxy(t)
	_, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String()})
	victim := dialRaw(t, addr, "root", "")
	msg := "The client was disconnected by the server because of inactivity."
	var wire []byte
	wire = append(wire, byte(9+len(msg)), 0, 0, 0)
	wire = appendErr(wire, &Error{Code: 4031, State: "HY000", Message: msg})
	cp.cutWith(wire)
	p, seq := victim.read()
	if e := parseErrPacket(p); p[0] != mysql.ERR_HEADER || seq != 0 || e.Code != 4031 || e.Message != msg {
		t.Fatalf("got %q (seq %d)", p, seq)
	}
	victim.expectClosed()
}

// A statement the policy holds when the backend closes is in flight: it
// gets the lost-backend error once forwarded, and the session ends.
func TestBackendClosedWhilePolicyHolds(t *testing.T) {
	setupSchema(t)
	cp := newCutProxy(t)
	p := &blockPolicy{entered: make(chan struct{}, 1), release: make(chan struct{})}
	_, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String(), Policy: p})
	victim := dialRaw(t, addr, "root", "")
	victim.write(0, query("SELECT 'block'"))
	<-p.entered
	cp.cut()
	time.Sleep(100 * time.Millisecond) // the poller has seen it
	close(p.release)
	pl, _ := victim.read()
	if e := parseErrPacket(pl); pl[0] != mysql.ERR_HEADER || e.Code != errCodeBackendLost {
		t.Fatalf("got %q", pl)
	}
	victim.expectClosed()
}

// A statement in flight when the backend dies gets 1927 (a server-range
// code clients display) with SQLSTATE 08S01, and the session ends.
func TestBackendLostMidStatement(t *testing.T) {
	setupSchema(t)
	cp := newCutProxy(t)
	s, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String()})
	victim := dialRaw(t, addr, "root", "")
	before := s.Stats().BackendErrors
	victim.write(0, query("SELECT SLEEP(5)"))
	time.Sleep(200 * time.Millisecond)
	cp.cut()
	p, _ := victim.read()
	if e := parseErrPacket(p); p[0] != mysql.ERR_HEADER || e.Code != errCodeBackendLost || e.State != "08S01" ||
		!strings.Contains(e.Message, "Lost connection to backend") {
		t.Fatalf("got %q", p)
	}
	victim.expectClosed()
	if s.Stats().BackendErrors <= before {
		t.Error("lost backend not counted")
	}
}

// A client that never answers the greeting is closed after
// HandshakeTimeout, and its backend connection with it.
func TestHandshakeTimeout(t *testing.T) {
	s, addr := startProxy(t, Config{HandshakeTimeout: 300 * time.Millisecond})
	c := dialSilent(t, addr)
	start := time.Now()
	expectEOF(t, c, 5*time.Second)
	if d := time.Since(start); d < 200*time.Millisecond || d > 2*time.Second {
		t.Errorf("closed after %v, want about 300ms", d)
	}
	waitFor(t, func() bool { return s.Stats().Connections == 0 })
}

// A backend that gives up on a client that never answers the greeting
// closes that client at once, as it closed: MariaDB resets on
// connect_timeout, and the client then reads a reset as it would directly.
func TestBackendGivesUpDuringHandshake(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(map[bool]string{false: "close", true: "reset"}[reset], func(t *testing.T) {
			cp := newCutProxy(t)
			s, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String(), HandshakeTimeout: time.Minute})
			c := dialSilent(t, addr)
			if reset {
				cp.lingerZero()
			}
			cp.cut()
			start := time.Now()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := io.ReadAll(c)
			if reset && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read %v, want a reset", err)
			}
			if !reset && err != nil {
				t.Fatalf("client read %v, want EOF", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("client closed %v after its backend", d)
			}
			waitFor(t, func() bool { return s.Stats().Connections == 0 })
		})
	}
}

// A backend that resets a session just after its login OK (the cut may
// reach rgproxy before or after it has relayed that OK and left the
// login): the client reads the OK, then a reset, in either order.
func TestBackendResetRightAfterLogin(t *testing.T) {
	ln := serveTCP(t, func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		sc := &scriptConn{br: bufio.NewReader(c), bw: bufio.NewWriter(c), seq: 255, seen: &scriptSeen{}}
		sc.send(mariaGreeting(supportedCaps, 0, "mysql_native_password"))
		if _, ok := sc.recv(); !ok {
			return
		}
		sc.send(okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
		_ = c.(*net.TCPConn).SetLinger(0)
	})
	_, addr := startProxy(t, Config{BackendAddr: ln.Addr().String()})
	for range 20 {
		victim := dialRaw(t, addr, "root", "")
		_ = victim.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := victim.br.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client read %v, want a reset", err)
		}
	}
}

// dialSilent connects and reads the greeting, and says nothing more.
func dialSilent(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	g, _, err := readMessage(br, nil, 1<<20)
	if err != nil || len(g) == 0 || g[0] != 10 {
		t.Fatalf("greeting %q: %v", g, err)
	}
	return c
}

// expectEOF waits for the peer to close c.
func expectEOF(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection not closed: %v", err)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMaxConnections(t *testing.T) {
	setupSchema(t)
	s, addr := startProxy(t, Config{MaxConnections: 1})
	first := dialRaw(t, addr, "root", "")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	rc := &rawClient{t: t, c: c}
	rc.br, rc.bw = newBufs(c)
	p, seq := rc.read()
	if e := parseErrPacket(p); p[0] != mysql.ERR_HEADER || seq != 0 || e.Code != mysql.ER_CON_COUNT_ERROR || e.State != "08004" || e.Message != "Too many connections" {
		t.Fatalf("got %q", p)
	}
	rc.expectClosed()
	if _, m := first.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("first session affected")
	}
	if st := s.Stats(); st.Connections != 1 || st.Sessions != 2 || st.ClientBytes == 0 || st.BackendBytes == 0 {
		t.Errorf("stats %+v", st)
	}
}

// blockPolicy holds statements named "rgp:block" in Before until released.
type blockPolicy struct {
	entered   chan struct{}
	release   chan struct{}
	cancelled chan struct{} // optional: told when Before's ctx ends
}

func (p *blockPolicy) Open(SessionInfo) SessionPolicy { return p }
func (p *blockPolicy) Before(ctx context.Context, st *Statement, _ Backend) Verdict {
	if st.Query == "SELECT 'block'" {
		p.entered <- struct{}{}
		select {
		case <-p.release:
		case <-ctx.Done():
			if p.cancelled != nil {
				p.cancelled <- struct{}{}
			}
			return Verdict{Reply: &Reply{Err: &Error{Code: 1105, Message: "cancelled"}}}
		}
	}
	return Verdict{}
}
func (p *blockPolicy) After(*Statement, *Outcome)   {}
func (p *blockPolicy) Event(EventKind, SessionInfo) {}

func TestShutdown(t *testing.T) {
	setupSchema(t)
	pol := &blockPolicy{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s, err := NewServer(Config{BackendAddr: backendAddr, Policy: pol, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()
	idle := dialRaw(t, addr, "root", "")
	busy := dialRaw(t, addr, "root", "")
	busy.write(0, query("SELECT 'block'"))
	<-pol.entered
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	idle.expectClosed() // idle sessions close at once
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("still accepting after Shutdown")
	}
	close(pol.release) // the running statement finishes...
	if raw, m := busy.response(respGeneric, false); m.ErrCode != 0 || !strings.Contains(string(raw), "block") {
		t.Fatalf("busy statement got %q", raw)
	}
	busy.expectClosed() // ...and then its session closes
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if s.Stats().Connections != 0 {
		t.Errorf("connections left: %d", s.Stats().Connections)
	}
}

func TestShutdownDeadline(t *testing.T) {
	setupSchema(t)
	pol := &blockPolicy{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s, err := NewServer(Config{BackendAddr: backendAddr, Policy: pol, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(ln)
	busy := dialRaw(t, ln.Addr().String(), "root", "")
	busy.write(0, query("SELECT 'block'"))
	<-pol.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has already passed: everything closes now
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v", err)
	}
	busy.expectClosed()
}

// A client that leaves while the policy holds its statement cancels
// Before's context.
func TestBeforeCancelledWhenClientLeaves(t *testing.T) {
	setupSchema(t)
	pol := &blockPolicy{entered: make(chan struct{}, 1), release: make(chan struct{}), cancelled: make(chan struct{}, 1)}
	_, addr := startProxy(t, Config{Policy: pol})
	rc := dialRaw(t, addr, "root", "")
	rc.write(0, query("SELECT 'block'"))
	<-pol.entered
	rc.c.Close()
	select {
	case <-pol.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("Before's context was not cancelled")
	}
}

// A pipelining client is not mistaken for a leaving one.
func TestSlowBeforeKeepsPipelinedCommand(t *testing.T) {
	setupSchema(t)
	pol := &blockPolicy{entered: make(chan struct{}, 1), release: make(chan struct{}), cancelled: make(chan struct{}, 1)}
	_, addr := startProxy(t, Config{Policy: pol}, func(s *Server) { s.hangupDelay = 0 }) // check the client at once
	rc := dialRaw(t, addr, "root", "")
	rc.write(0, query("SELECT 'block'"))
	<-pol.entered
	rc.write(0, []byte{mysql.COM_PING}) // sent before the first answer
	close(pol.release)
	if _, m := rc.response(respGeneric, false); m.ErrCode != 0 {
		t.Fatalf("first statement: %d", m.ErrCode)
	}
	if raw, m := rc.response(respGeneric, false); m.ErrCode != 0 || raw[4] != mysql.OK_HEADER {
		t.Fatalf("pipelined ping: %q", raw)
	}
}
