package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/rgpolicy"
	"github.com/rgproxy/rgproxy/internal/statuspage"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// TestPprofOnlyWithTheFlag: the status port serves Go's profiles only when
// --enable-pprof asks for them.
func TestPprofOnlyWithTheFlag(t *testing.T) {
	ready := func(context.Context) (readiness, error) { return readiness{}, nil }
	for _, tc := range []struct {
		on   bool
		want int
	}{{false, http.StatusNotFound}, {true, http.StatusOK}} {
		h, err := statusHandler(newMetrics(), ready, new(sync.WaitGroup), tc.on, testConsole(nil))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			if rec.Code != tc.want {
				t.Errorf("pprof %v: GET %s = %d, want %d", tc.on, path, rec.Code, tc.want)
			}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		if rec.Code != http.StatusOK {
			t.Errorf("pprof %v: /healthz = %d", tc.on, rec.Code)
		}
	}
}

// TestConcurrentReadyzShareOneProbe: requests that arrive while a backend
// probe runs wait for it rather than open connections of their own; the
// next request after it starts a new one.
func TestConcurrentReadyzShareOneProbe(t *testing.T) {
	var probes atomic.Int64
	var running sync.WaitGroup // the probes' goroutines
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	probe := sharedProbe(func(context.Context) (readiness, error) {
		probes.Add(1)
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return readiness{}, errors.New("backend says no")
	}, &running)
	defer running.Wait()
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := probe(context.Background())
		errs <- err
	}()
	<-started // the first request's probe runs
	// The others are released only once each is about to ask: with both
	// cores busy, goroutines started but not yet run when the probe ended
	// each started one of their own (50 probes for 50 requests).
	asking := make(chan struct{}, n)
	for range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			asking <- struct{}{}
			_, err := probe(context.Background())
			errs <- err
		}()
	}
	for range n - 1 {
		<-asking
	}
	// A request that gives up stops waiting at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := probe(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || err.Error() != "backend says no" {
			t.Fatalf("a request got %v, want the probe's error", err)
		}
	}
	// Requests scheduled only after the probe ended may have started
	// others; most shared the first.
	p := probes.Load()
	if p >= n/2 {
		t.Fatalf("%d probes for %d concurrent requests", p, n)
	}
	// A finished probe is not an answer for later requests.
	if _, err := probe(context.Background()); err == nil || probes.Load() != p+1 {
		t.Fatalf("a later request: %v, %d probes (was %d)", err, probes.Load(), p)
	}
}

// testConsole is a console source without connections.
func testConsole(p *rgpolicy.Policy) *consoleSource {
	return &consoleSource{proxyID: "px:4000", policy: p, now: time.Now, conns: func() (int64, int) { return 2, 100 }}
}

// GET / is the console's page, GET /api/console its JSON (bounded by
// ?groups= and ?shapes=); every other path stays 404.
func TestConsoleRoutes(t *testing.T) {
	ready := func(context.Context) (readiness, error) { return readiness{}, nil }
	tc, err := tokenclient.New(tokenclient.Config{Servers: []string{"127.0.0.1:1"}, ProxyID: "px"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	pol, err := rgpolicy.New(rgpolicy.Config{Tokens: tc, CPU: rgpolicy.CPUWall})
	if err != nil {
		t.Fatal(err)
	}
	for _, metering := range []bool{false, true} {
		var p *rgpolicy.Policy
		if metering {
			p = pol
		}
		h, err := statusHandler(newMetrics(), ready, new(sync.WaitGroup), false, testConsole(p))
		if err != nil {
			t.Fatal(err)
		}
		get := func(method, path string) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
			return rec
		}
		page := get("GET", "/")
		if page.Code != 200 || !strings.Contains(page.Body.String(), "rgproxy console") ||
			!strings.Contains(page.Header().Get("Content-Security-Policy"), "script-src 'sha256-") {
			t.Fatalf("GET / = %d %v", page.Code, page.Header())
		}
		rec := get("GET", "/api/console")
		var c proxyConsole
		if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil || rec.Code != 200 {
			t.Fatalf("GET /api/console = %d %q: %v", rec.Code, rec.Body.String(), err)
		}
		if c.Kind != "rgproxy" || c.ProxyID != "px:4000" || c.Metering != metering || c.Connections != 2 || c.MaxConnections != 100 ||
			(!metering && (c.ServiceLimit != nil || c.Capacity != nil)) {
			t.Fatalf("metering %v: %+v", metering, c)
		}
		if metering {
			// Before rgserver answers, the built-in default.
			if c.GroupsTotal != 1 || len(c.Groups) != 1 || c.Groups[0].Name != "default" || c.Groups[0].RUPerSec != nil ||
				c.Groups[0].Mode != "ENFORCE" || c.CPUSource != "wall" || c.Shapes == nil {
				t.Fatalf("metering: %+v", c)
			}
			// rgserver does not answer: the service limit is unknown,
			// and said so, within the wait; the answer is kept.
			if sl := c.ServiceLimit; sl == nil || sl.Known || sl.Error == "" || c.Capacity == nil || c.Capacity.Over {
				t.Fatalf("metering, no rgserver: service limit %+v, capacity %+v", sl, c.Capacity)
			}
			var again proxyConsole
			if err := json.Unmarshal(get("GET", "/api/console").Body.Bytes(), &again); err != nil || again.ServiceLimit == nil ||
				!again.ServiceLimit.AsOf.Equal(c.ServiceLimit.AsOf) {
				t.Fatalf("a second read within %v asked again: %+v, %v", serviceLimitTTL, again.ServiceLimit, err)
			}
			if rec := get("GET", "/api/console?groups=0"); !strings.Contains(rec.Body.String(), `"groups":[]`) {
				t.Fatalf("?groups=0: %s", rec.Body.String())
			}
		}
		for path, code := range map[string]int{"/api/console?groups=x": 400, "/api/console?shapes=1001": 400,
			"/nope": 404, "/index.html": 404, "/api/": 404, "/api/console/x": 404} {
			if rec := get("GET", path); rec.Code != code {
				t.Errorf("GET %s = %d, want %d", path, rec.Code, code)
			}
		}
		if rec := get("POST", "/"); rec.Code == 200 {
			t.Errorf("POST / = %d", rec.Code)
		}
	}
}

// The console's own address serves its page and JSON and nothing else;
// its default is a port browsers open (10080, the status port, is on
// their blocked list).
func TestConsoleAddress(t *testing.T) {
	cfg, _, err := parseArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConsoleAddr != "127.0.0.1:10081" || cfg.StatusAddr != "127.0.0.1:10080" {
		t.Fatalf("defaults: --console-addr %q --status-addr %q", cfg.ConsoleAddr, cfg.StatusAddr)
	}
	if statuspage.BrowserBlocked(cfg.ConsoleAddr) || !statuspage.BrowserBlocked(cfg.StatusAddr) {
		t.Fatalf("the console's default %s must open in a browser (the status port %s does not)", cfg.ConsoleAddr, cfg.StatusAddr)
	}
	status, err := statusHandler(newMetrics(), func(context.Context) (readiness, error) { return readiness{}, nil }, new(sync.WaitGroup), true, testConsole(nil))
	if err != nil {
		t.Fatal(err)
	}
	h := consoleHandler(status)
	for path, code := range map[string]int{"/": 200, "/api/console": 200, "/metrics": 404, "/healthz": 404,
		"/readyz": 404, "/debug/pprof/": 404, "/nope": 404} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != code {
			t.Errorf("console address: GET %s = %d, want %d", path, rec.Code, code)
		}
	}
}
