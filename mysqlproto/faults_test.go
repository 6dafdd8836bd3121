package mysqlproto

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
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
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != errCodeConnHost || !strings.Contains(me.Message, dead) ||
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

// cutProxy is a TCP relay in front of the backend whose connections the
// test can cut, to lose the backend mid-session.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := &cutProxy{ln: ln}
	t.Cleanup(func() { ln.Close(); cp.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backendAddr)
			if err != nil {
				c.Close()
				continue
			}
			cp.mu.Lock()
			cp.conns = append(cp.conns, c, b)
			cp.mu.Unlock()
			go func() { io.Copy(b, c); b.Close() }()
			go func() { io.Copy(c, b); c.Close() }()
		}
	}()
	return cp
}

func (cp *cutProxy) cut() {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, c := range cp.conns {
		c.Close()
	}
	cp.conns = nil
}

func TestBackendLostMidSession(t *testing.T) {
	setupSchema(t)
	cp := newCutProxy(t)
	s, addr := startProxy(t, Config{BackendAddr: cp.ln.Addr().String()})
	victim := dialRaw(t, addr, "root", "")
	_, good := startProxy(t, Config{})
	other := dialRaw(t, good, "root", "")
	before := s.Stats().BackendErrors
	cp.cut()
	victim.write(0, query("SELECT 1"))
	p, _ := victim.read()
	if e := parseErrPacket(p); p[0] != hdrERR || e.Code != errCodeServerLost || !strings.Contains(e.Message, "Lost connection to backend") {
		t.Fatalf("got %q", p)
	}
	victim.expectClosed()
	if s.Stats().BackendErrors <= before {
		t.Error("lost backend not counted")
	}
	if _, m := other.cmd(respGeneric, false, []byte{comPing}); m.ErrCode != 0 {
		t.Fatal("other session affected")
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
	if e := parseErrPacket(p); p[0] != hdrERR || seq != 0 || e.Code != errCodeConCount || e.State != "08004" || e.Message != "Too many connections" {
		t.Fatalf("got %q", p)
	}
	rc.expectClosed()
	if _, m := first.cmd(respGeneric, false, []byte{comPing}); m.ErrCode != 0 {
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
	_, addr := startProxy(t, Config{Policy: pol}, func(s *Server) { s.watchDelay = 0 }) // watch the client at once
	rc := dialRaw(t, addr, "root", "")
	rc.write(0, query("SELECT 'block'"))
	<-pol.entered
	rc.write(0, []byte{comPing}) // sent before the first answer
	close(pol.release)
	if _, m := rc.response(respGeneric, false); m.ErrCode != 0 {
		t.Fatalf("first statement: %d", m.ErrCode)
	}
	if raw, m := rc.response(respGeneric, false); m.ErrCode != 0 || raw[4] != hdrOK {
		t.Fatalf("pipelined ping: %q", raw)
	}
}
