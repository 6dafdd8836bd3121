package tokenclient

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// startClient makes and starts a Client on a fake clock against servers.
func startClient(t *testing.T, mutate func(*Config), servers ...string) (*Client, *fakeClock) {
	t.Helper()
	c, clk := newTestClient(t, func(cfg *Config) {
		cfg.Servers = servers
		if mutate != nil {
			mutate(cfg)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, clk
}

// acquire runs acquireAll in the background and returns its result
// channel.
func acquire(c *Client, group string, n float64, maxWait time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := acquireAll(context.Background(), c, group, rruOf(n), maxWait)
		done <- err
	}()
	return done
}

func result(t *testing.T, done <-chan error, step func()) error {
	t.Helper()
	var err error
	waitFor(t, "AcquireShare to return", func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	}, step)
	return err
}

// End to end over gRPC: Start loads the Watch snapshot, a waiting
// AcquireShare is served by a grant, and Close reports the consumption.
func TestStreamGrantAndFinalReport(t *testing.T) {
	s := startServer(t)
	c, _ := startClient(t, nil, s.addr)
	if g, ok := c.Group("DEFAULT"); !ok || g.RUPerSec != resourcegroup.Unlimited || g.Version == 0 {
		t.Fatalf("default from the snapshot: %+v %v", g, ok)
	}
	first := s.nextReq(t, nil) // the stream's first request: a resync with `default`
	if first.GetProxyId() != "p1" || groupEntry(first, "default") == nil {
		t.Fatalf("first request %v", first)
	}
	if err := result(t, acquire(c, "rg1", 5, 30*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	var ask *tokenpb.GroupTokenRequest
	for ask == nil {
		ask = groupEntry(s.nextReq(t, nil), "rg1")
	}
	if ask.GetReportOnly() || ask.GetTokensWanted() < 5 {
		t.Fatalf("ask %v", ask)
	}
	waitFor(t, "connected", func() bool { return c.stream.status().connected }, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var final *tokenpb.GroupTokenRequest
	for final == nil {
		final = groupEntry(s.nextReq(t, nil), "rg1")
	}
	if !final.GetReportOnly() || !near(final.GetConsumption().GetRru(), 5) {
		t.Fatalf("final report %v", final)
	}
}

func TestNotLeaderRedirect(t *testing.T) {
	leader := startServer(t)
	follower := startServer(t)
	follower.tok.notLeader = &leader.addr
	c, _ := startClient(t, nil, follower.addr)
	if err := result(t, acquire(c, "a", 3, 30*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	follower.nextReq(t, nil)
	if req := leader.nextReq(t, nil); req.GetProxyId() != "p1" {
		t.Fatalf("leader got %v", req)
	}
}

// When its server dies the client rotates to the next one, with backoff on
// its clock. Each stream's first message says what the proxy can enforce.
func TestReconnectAfterServerDies(t *testing.T) {
	s1 := startServer(t)
	s2 := startServer(t)
	caps := Capabilities{CanKill: true, Instance: "10.0.0.1:4000", Version: "v9"}
	c, clk := startClient(t, func(cfg *Config) { cfg.Capabilities = caps }, s1.addr, s2.addr)
	if err := result(t, acquire(c, "a", 3, 30*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	first := s1.nextReq(t, nil)
	if got := first.GetCapabilities(); !got.GetCanKill() || got.GetInstance() != caps.Instance || got.GetVersion() != caps.Version {
		t.Fatalf("first message's capabilities: %v", got)
	}
	s1.grpcS.Stop()
	step := func() { clk.Advance(50 * time.Millisecond) }
	req := s2.nextReq(t, step)
	if groupEntry(req, "a") == nil {
		t.Fatalf("resync request on s2 lacks group a: %v", req)
	}
	if !req.GetCapabilities().GetCanKill() {
		t.Fatalf("the new stream's first message lacks the capabilities: %v", req)
	}
	if err := result(t, acquire(c, "a", 1000, 30*time.Second), step); err != nil {
		t.Fatal(err)
	}
	if c.Degraded() {
		t.Fatal("degraded although s2 grants")
	}
}

// rgserver silent → degraded after DegradedAfter; answering again → resync.
func TestDegradedAndResyncOverStream(t *testing.T) {
	s := startServer(t)
	c, clk := startClient(t, nil, s.addr)
	s.nextReq(t, nil)
	waitFor(t, "connected", func() bool { return c.stream.status().connected }, nil)
	s.tok.mu.Lock()
	s.tok.silent = true
	s.tok.mu.Unlock()
	done := acquire(c, "a", 1, 30*time.Second)
	s.nextReq(t, nil)
	waitFor(t, "degraded mode", c.Degraded, func() { clk.Advance(100 * time.Millisecond) })
	// The group is unknown to the cache and was never granted: no local
	// rate; the statement keeps waiting until rgserver answers again.
	s.tok.mu.Lock()
	s.tok.silent = false
	s.tok.mu.Unlock()
	if err := result(t, done, func() { clk.Advance(100 * time.Millisecond) }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "resync", func() bool { return !c.Degraded() }, func() { clk.Advance(100 * time.Millisecond) })
}

func TestCacheDirReload(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t)
	c1, _ := startClient(t, func(cfg *Config) { cfg.CacheDir = dir }, s.addr)
	ctx := context.Background()
	if err := c1.Store().CreateGroup(ctx, resourcegroup.Group{Name: "RG1", RUPerSec: 100}); err != nil {
		t.Fatal(err)
	}
	if err := c1.Store().BindUser(ctx, resourcegroup.Binding{User: "app", Host: "%", Group: "rg1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot file", func() bool {
		data, err := os.ReadFile(filepath.Join(dir, cacheFile))
		if err != nil {
			return false
		}
		snap, err := decodeSnapshot(data)
		return err == nil && snap.Bindings["app@%"].Group == "rg1"
	}, nil)
	c1.Close()

	c2, clk := startClient(t, func(cfg *Config) { cfg.CacheDir = dir }, deadAddr(t))
	if !c2.Degraded() {
		t.Fatal("started from the cache but not degraded")
	}
	if g, ok := c2.Group("rg1"); !ok || g.RUPerSec != 100 {
		t.Fatalf("group from the cache: %+v %v", g, ok)
	}
	if b, ok := c2.Binding("app", "%"); !ok || b.Group != "rg1" {
		t.Fatalf("binding from the cache: %+v %v", b, ok)
	}
	// Local refill at 100 RU/s (one proxy): 50 RU take 0.5 s.
	done := acquire(c2, "rg1", 50, time.Second)
	waitFor(t, "the statement to sleep", func() bool {
		c2.groups.mu.Lock()
		defer c2.groups.mu.Unlock()
		gs, ok := c2.groups.byName["rg1"]
		return ok && gs.bucket.Tokens(clk.Now()) < 0
	}, nil)
	if err := result(t, done, func() { clk.Advance(10 * time.Millisecond) }); err != nil {
		t.Fatal(err)
	}

	c3, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{deadAddr(t)} })
	defer c3.Close()
	if err := c3.Start(context.Background()); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no server, no cache: %v", err)
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add([]byte(`{"revision":3,"groups":{"RG":{"Name":"RG","RUPerSec":5}},"bindings":{"u":{"User":"u","Group":"RG"}}}`))
	f.Add([]byte(`{"groups":{"x":{"Name":"","QueryLimit":{"RU":1}}}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"watches":{"3":{"ID":3,"Group":"RG","Match":1,"Text":"select 1"},"4":{"ID":0,"Text":"x"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		for name, g := range snap.Groups {
			if name == "" || name != g.Name || name != resourcegroup.NormalizeName(name) {
				t.Fatalf("group key %q name %q", name, g.Name)
			}
		}
		users := map[string]int{}
		for key, b := range snap.Bindings {
			if b.User == "" || key != b.Account() {
				t.Fatalf("binding key %q of account %q", key, b.Account())
			}
			users[b.User]++
		}
		if !maps.Equal(users, snap.users) {
			t.Fatalf("bindings per user %v, counted %v", users, snap.users)
		}
		for id, w := range snap.Watches {
			if id == 0 || w.ID != id || w.Group != resourcegroup.NormalizeName(w.Group) {
				t.Fatalf("watch key %d: %+v", id, w)
			}
		}
	})
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		attempt  int
		min, max time.Duration
	}{
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 400 * time.Millisecond, 800 * time.Millisecond},
		{6, time.Second, 2 * time.Second},
		{100, time.Second, 2 * time.Second},
	}
	for _, tc := range tests {
		for range 50 {
			if d := backoff(tc.attempt); d < tc.min || d > tc.max {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", tc.attempt, d, tc.min, tc.max)
			}
		}
	}
}

// Many sessions on the real clock: every RU acquired or charged reaches
// rgserver exactly once (the final report included).
func TestConcurrentAccountingRealClock(t *testing.T) {
	s := startServer(t)
	c, err := New(Config{Servers: []string{s.addr}, ProxyID: "p1", Logger: quietLogger(), ReportPeriod: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const sessions, stmts = 16, 50
	errs := make(chan error, sessions)
	for i := range sessions {
		go func() {
			group := []string{"a", "b"}[i%2]
			for range stmts {
				if _, err := acquireAll(ctx, c, group, rruOf(1), 5*time.Second); err != nil {
					errs <- err
					return
				}
				c.Charge(group, ru.Consumption{WRU: 0.5})
			}
			errs <- nil
		}()
	}
	for range sessions {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "connected", func() bool { return c.stream.status().connected }, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close has sent the last report, but the server may not have read it
	// yet (on a loaded machine it read 586 of 800 statements by then): read
	// until every statement is reported, or 10 s pass without it.
	var rru, wru float64
	var statements uint64
	add := func(req *tokenpb.TokenRequest) {
		for _, g := range req.GetGroups() {
			rru += g.GetConsumption().GetRru()
			wru += g.GetConsumption().GetWru()
			statements += g.GetConsumption().GetStatements()
		}
	}
	deadline := time.After(10 * time.Second)
	for statements < sessions*stmts {
		select {
		case req := <-s.tok.reqs:
			add(req)
			continue
		case <-deadline:
		}
		break
	}
	for drained := false; !drained; { // a report beyond them is an error too
		select {
		case req := <-s.tok.reqs:
			add(req)
		default:
			drained = true
		}
	}
	if !near(rru, sessions*stmts) || !near(wru, sessions*stmts/2) || statements != sessions*stmts {
		t.Fatalf("reported rru=%v wru=%v statements=%d, want %d %d %d", rru, wru, statements, sessions*stmts, sessions*stmts/2, sessions*stmts)
	}
}
