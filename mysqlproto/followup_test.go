package mysqlproto

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
)

// followPolicy's FollowUp waits, for each statement whose text is in
// waitFor, until the test says the client has its response, then runs
// query on the session's backend connection and records the answer.
type followPolicy struct {
	query    string
	waitFor  string
	released chan struct{}
	mu       sync.Mutex
	answers  []string
	errs     []error
	closed   chan struct{}
}

func (p *followPolicy) Open(SessionInfo) SessionPolicy { return &followSession{p: p} }

type followSession struct {
	passThroughSession
	p *followPolicy
}

func (s *followSession) Event(kind EventKind, _ SessionInfo) {
	if kind == EventClose {
		close(s.p.closed)
	}
}

func (s *followSession) FollowUp(ctx context.Context, st *Statement, out *Outcome, be Backend) {
	if st.Query != s.p.waitFor {
		return
	}
	select {
	case <-s.p.released:
	case <-time.After(5 * time.Second):
		// The client never got its response: FollowUp ran before it was
		// flushed.
		s.p.mu.Lock()
		s.p.errs = append(s.p.errs, errors.New("the client did not have its response while FollowUp ran"))
		s.p.mu.Unlock()
		return
	}
	_, rows, err := be.Query(ctx, s.p.query)
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if err != nil {
		s.p.errs = append(s.p.errs, err)
		return
	}
	s.p.answers = append(s.p.answers, fmt.Sprintf("affected=%d %s", out.AffectedRows, *rows[0][0]))
}

// TestFollowUpAfterResponse: FollowUp runs once the client has its whole
// response (the statement's latency does not include it), its query sees
// the session's own state, and the session goes on as before.
func TestFollowUpAfterResponse(t *testing.T) {
	setupSchema(t)
	pol := &followPolicy{query: "SELECT @fu", waitFor: "SET @fu = 'seen'", released: make(chan struct{}), closed: make(chan struct{})}
	_, addr := startProxy(t, Config{Policy: pol})
	c := oneConn(t, addr)
	ctx := context.Background()
	if _, err := c.ExecContext(ctx, "SET @fu = 'seen'"); err != nil {
		t.Fatal(err)
	}
	close(pol.released) // the client has its OK while FollowUp still waits
	var v string
	if err := c.QueryRowContext(ctx, "SELECT @fu").Scan(&v); err != nil || v != "seen" {
		t.Fatalf("next statement: %q, %v", v, err)
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if len(pol.errs) != 0 || len(pol.answers) != 1 || pol.answers[0] != "affected=0 seen" {
		t.Fatalf("FollowUp answers %q, errors %v", pol.answers, pol.errs)
	}
}

// TestFollowUpBackendLost: when a FollowUp query finds the backend
// connection gone, the session ends at once (not at the client's next
// command), as after any failed policy query.
func TestFollowUpBackendLost(t *testing.T) {
	setupSchema(t)
	pol := &followPolicy{query: "SELECT 1", waitFor: "SELECT CONNECTION_ID()", released: make(chan struct{}), closed: make(chan struct{})}
	_, addr := startProxy(t, Config{Policy: pol})
	c := oneConn(t, addr)
	ctx := context.Background()
	var id int
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	direct := openDB(t, backendAddr)
	if _, err := direct.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatal(err)
	}
	close(pol.released)
	select {
	case <-pol.closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not end after its FollowUp query failed")
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if len(pol.errs) != 1 || !errors.Is(pol.errs[0], ErrBackendLost) {
		t.Fatalf("FollowUp errors %v, want one ErrBackendLost", pol.errs)
	}
}

// nopFollowPolicy is nopPolicy with a FollowUp that does nothing.
type nopFollowPolicy struct{ nopPolicy }

func (p *nopFollowPolicy) Open(SessionInfo) SessionPolicy { return p }

func (p *nopFollowPolicy) FollowUp(context.Context, *Statement, *Outcome, Backend) {}

// TestFollowUpAllocatesNothing: a policy with a FollowUp costs a statement
// no allocation more than one without (the Backend it gets is the
// session's own).
func TestFollowUpAllocatesNothing(t *testing.T) {
	allocs := func(pol Policy) float64 {
		s, err := NewServer(Config{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		ss := newSession(s, discardConn{})
		ss.pol = s.cfg.Policy.Open(SessionInfo{})
		ss.follow, _ = ss.pol.(FollowUpper)
		ss.bwr = bufio.NewWriter(io.Discard)
		cmd := wirePacket(query("SELECT c FROM sbtest1 WHERE id=4242"))
		resp := smallResultSetRows(1)
		cr, br := bytes.NewReader(nil), bytes.NewReader(nil)
		ss.crd, ss.brd = bufio.NewReader(cr), bufio.NewReader(br)
		defer ss.cancel()
		return testing.AllocsPerRun(200, func() {
			cr.Reset(cmd)
			ss.crd.Reset(cr)
			br.Reset(resp)
			ss.brd.Reset(br)
			if err := ss.command(); err != nil {
				t.Fatal(err)
			}
			ss.endCommand()
		})
	}
	without, with := allocs(&nopPolicy{}), allocs(&nopFollowPolicy{})
	if with != without {
		t.Fatalf("%v allocations per statement with a FollowUp, %v without", with, without)
	}
}
