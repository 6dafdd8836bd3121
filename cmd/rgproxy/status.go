package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rgproxy/rgproxy/internal/statuspage"
)

// statusHandler serves /metrics, /healthz (the process is up) and /readyz
// (the backend answers), with etcd-style JSON bodies and 503 on failure;
// the console (console.go): its page at / and its JSON at /api/console;
// with withPprof also Go's profiles under /debug/pprof/, which show the
// command line, memory and goroutines to whoever reaches the port. Any
// other path is 404. probes holds the /readyz probes running (the caller
// waits for it once the server is closed).
func statusHandler(m *metrics, probe func(context.Context) (readiness, error), probes *sync.WaitGroup, withPprof bool, console *consoleSource) (http.Handler, error) {
	page, err := statuspage.NewConsole(consoleHTML)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.Handle("GET /{$}", page)
	mux.HandleFunc("GET /api/console", console.serveJSON)
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	probe = sharedProbe(probe, probes)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, health{Health: "true"}, nil)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
		defer cancel()
		rd, err := probe(ctx)
		h := health{Health: "true"}
		if rd.Metering {
			h.Degraded = boolText(rd.Degraded)
			h.CPUSource = rd.CPUSource
			h.WriteSource = rd.WriteSource
			h.QueryLimitUnenforced = rd.QueryLimitUnenforced[:min(len(rd.QueryLimitUnenforced), maxUnenforcedListed)]
			h.QueryLimitUnenforcedCount = len(rd.QueryLimitUnenforced)
		}
		writeHealth(w, h, err)
	})
	return mux, nil
}

// consoleHandler serves the console's address: the page at / and its
// JSON at /api/console, as status serves them; any other path is 404, so
// /metrics and the profiles stay on the status address only.
func consoleHandler(status http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", status)
	mux.Handle("GET /api/console", status)
	return mux
}

// readiness is what /readyz reports besides the backend probe.
type readiness struct {
	// Metering is false for a pure proxy.
	Metering bool
	// Degraded: no grant from rgserver lately; the proxy serves from local
	// refills (and, after a start without rgserver, its cached snapshot).
	// Still ready: refusing traffic then would turn an rgserver outage
	// into a database outage.
	Degraded bool
	// CPUSource is where statements' CPU time comes from (proc or wall).
	CPUSource string
	// WriteSource is where the bytes statements write come from now
	// (binlog, estimate or packet).
	WriteSource string
	// QueryLimitUnenforced are the groups whose QUERY_LIMIT this proxy
	// cannot carry out (ACTION = KILL without --admin-user). Still
	// ready: it serves, and says so.
	QueryLimitUnenforced []string
}

// maxUnenforcedListed bounds the groups /readyz names.
const maxUnenforcedListed = 100

type health struct {
	Health      string `json:"health"`
	Degraded    string `json:"degraded,omitempty"`
	CPUSource   string `json:"cpu_source,omitempty"`
	WriteSource string `json:"write_source,omitempty"`
	// QueryLimitUnenforced lists at most maxUnenforcedListed of them;
	// QueryLimitUnenforcedCount counts them all.
	QueryLimitUnenforced      []string `json:"query_limit_unenforced,omitempty"`
	QueryLimitUnenforcedCount int      `json:"query_limit_unenforced_count,omitempty"`
	Reason                    string   `json:"reason,omitempty"`
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func writeHealth(w http.ResponseWriter, h health, err error) {
	code := http.StatusOK
	if err != nil {
		h.Health, h.Reason = "false", err.Error()
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}

// sharedProbe lets concurrent /readyz requests share one backend probe:
// however many come at once, at most one connection to the backend is
// open for them, so a flood of probes cannot use up descriptors or the
// backend's connections, and each request still gets a fresh answer. A
// request whose context ends first stops waiting; the probe goes on for
// the others, within probeTimeout, on a goroutine held by running.
func sharedProbe(probe func(context.Context) (readiness, error), running *sync.WaitGroup) func(context.Context) (readiness, error) {
	var mu sync.Mutex
	var cur *probeCall
	return func(ctx context.Context) (readiness, error) {
		mu.Lock()
		c := cur
		if c == nil {
			c = &probeCall{done: make(chan struct{})}
			cur = c
			running.Go(func() {
				pctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
				c.r, c.err = probe(pctx)
				cancel()
				mu.Lock()
				cur = nil
				mu.Unlock()
				close(c.done)
			})
		}
		mu.Unlock()
		select {
		case <-c.done:
			return c.r, c.err
		case <-ctx.Done():
			return readiness{}, ctx.Err()
		}
	}
}

// probeCall is one backend probe and the result its waiters share.
type probeCall struct {
	done chan struct{}
	r    readiness
	err  error
}

// statusReadHeaderTimeout bounds how long a status-port client may take
// to send its request's headers: a client that opens connections and
// sends nothing does not keep them.
const statusReadHeaderTimeout = 5 * time.Second
