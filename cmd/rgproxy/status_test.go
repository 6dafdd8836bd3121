package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// TestPprofOnlyWithTheFlag: the status port serves Go's profiles only when
// --enable-pprof asks for them.
func TestPprofOnlyWithTheFlag(t *testing.T) {
	ready := func(context.Context) (readiness, error) { return readiness{}, nil }
	for _, tc := range []struct {
		on   bool
		want int
	}{{false, http.StatusNotFound}, {true, http.StatusOK}} {
		h := statusHandler(newMetrics(), ready, tc.on)
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
	})
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
	for range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := probe(context.Background())
			errs <- err
		}()
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
