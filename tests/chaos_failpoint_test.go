package tests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Chaos with failpoints inside real processes: `make test-failpoints`
// builds rgproxy with its failpoints compiled in (failpoint-toolexec) and
// names the directory in RGPROXY_FAILPOINT_BIN; each process then serves
// GO_FAILPOINTS_HTTP, through which the test turns faults on and off.

// startFailpointProxy runs the failpoint build of rgproxy with a failpoint
// HTTP endpoint; it returns the proxy and that endpoint's address.
func startFailpointProxy(t *testing.T, dir string, ts *tokenServer, extra ...string) (*proxy, string) {
	t.Helper()
	px := &proxy{Addr: freeAddr(t), StatusAddr: freeAddr(t)}
	fp := freeAddr(t)
	args := append([]string{"--listen", px.Addr, "--status-addr", px.StatusAddr, "--backend", backendAddr,
		"--token-server", ts.Addr, "--cache-dir", t.TempDir(), "--log-level", "warn"}, extra...)
	p := &process{log: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(dir, "rgproxy"), args...)
	p.cmd.Env = append(os.Environ(), "GO_FAILPOINTS_HTTP="+fp)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(10 * time.Second)
		if t.Failed() {
			t.Logf("failpoint rgproxy log:\n%s", p.log.String())
		}
	})
	px.process = p
	waitListening(t, px.Addr, p)
	waitListening(t, fp, p)
	return px, fp
}

// setFailpoint turns a tokenclient failpoint on (term) or off ("") in a
// process through its failpoint HTTP endpoint.
func setFailpoint(t *testing.T, endpoint, name, term string) {
	t.Helper()
	url := "http://" + endpoint + "/github.com/rgproxy/rgproxy/tokenclient/" + name
	method := http.MethodPut
	if term == "" {
		method = http.MethodDelete
	}
	req, _ := http.NewRequest(method, url, strings.NewReader(term))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s", method, url, resp.Status)
	}
}

// TestChaosFailpointTokenStreamStallsAndDrops: grants that come 3 s late
// never make a statement wait past --max-wait, and grants dropped in flight
// are lost, never counted twice: what the proxies received ≤ what rgserver
// granted ≤ received + the grants in flight at the drops.
func TestChaosFailpointTokenStreamStallsAndDrops(t *testing.T) {
	dir := os.Getenv("RGPROXY_FAILPOINT_BIN")
	if dir == "" {
		t.Skip("needs the failpoint build of rgproxy: run `make test-failpoints`")
	}
	ts := startTokenServer(t)
	const maxWait = 2 * time.Second
	a, fpA := startFailpointProxy(t, dir, ts, "--max-wait", maxWait.String())
	b, fpB := startFailpointProxy(t, dir, ts, "--max-wait", maxWait.String())
	appUser(t, "rgfp")
	const rate = 200
	adminExec(t, a.Addr, "DROP RESOURCE GROUP IF EXISTS rg_fp",
		fmt.Sprintf("CREATE RESOURCE GROUP rg_fp RU_PER_SEC = %d", rate),
		"ALTER USER 'rgfp'@'%' RESOURCE GROUP rg_fp")
	time.Sleep(time.Second)

	var worst atomic.Int64
	var stmts, refused, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, px := range []*proxy{a, b} {
		db := openDB(t, px.Addr, "user=rgfp", "password=apppw")
		db.SetMaxOpenConns(3)
		for range 3 {
			repeat(&wg, stop, func() bool {
				start := time.Now()
				_, err := db.ExecContext(context.Background(), "SELECT 1")
				if d := time.Since(start).Microseconds(); d > worst.Load() {
					worst.Store(d)
				}
				switch {
				case err == nil:
					stmts.Add(1)
				case mysqlErrNo(err) == 8252:
					refused.Add(1)
				default:
					other.Add(1)
				}
				return true
			})
		}
	}
	time.Sleep(3 * time.Second)
	// Stall: every grant reaches the proxies 3 s late, for 8 s.
	setFailpoint(t, fpA, "delayGrant", "return(3000)")
	setFailpoint(t, fpB, "delayGrant", "return(3000)")
	time.Sleep(8 * time.Second)
	setFailpoint(t, fpA, "delayGrant", "")
	setFailpoint(t, fpB, "delayGrant", "")
	stallWorst := time.Duration(worst.Load()) * time.Microsecond
	// Drop: the next two grants to proxy a break its stream in flight.
	setFailpoint(t, fpA, "dropGrant", "2*return(true)")
	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d statements, %d refused with 8252, %d other errors; slowest statement %v (max-wait %v)",
		stmts.Load(), refused.Load(), other.Load(), time.Duration(worst.Load())*time.Microsecond, maxWait)
	if other.Load() != 0 {
		t.Fatalf("%d statements failed with something else than 8252", other.Load())
	}
	if stallWorst > maxWait+500*time.Millisecond || time.Duration(worst.Load())*time.Microsecond > maxWait+500*time.Millisecond {
		t.Fatalf("a statement waited %v, more than --max-wait %v", time.Duration(worst.Load())*time.Microsecond, maxWait)
	}
	time.Sleep(time.Second)
	granted := metricSum(t, ts.StatusAddr, "rgserver_tokens_granted_total", `resource_group="rg_fp"`)
	received := metricSum(t, a.StatusAddr, "rgproxy_tokens_granted_total", `resource_group="rg_fp"`) +
		metricSum(t, b.StatusAddr, "rgproxy_tokens_granted_total", `resource_group="rg_fp"`)
	// A grant is at most the bucket's capacity (1 s of rate) at once, or a
	// 2 s trickle of at most the whole rate plus the full bucket spread
	// over the 5 s period: (rate + rate/5) × 2.
	maxGrant := (float64(rate) + float64(rate)/5) * 2
	lost := granted - received
	t.Logf("rgserver granted %.1f, proxies received %.1f: %.1f lost in flight (at most 2 drops × %.0f)", granted, received, lost, maxGrant)
	if received > granted+1e-6 {
		t.Fatalf("proxies received %.1f tokens, more than the %.1f granted", received, granted)
	}
	if lost <= 0 || lost > 2*maxGrant {
		t.Fatalf("%.1f tokens lost for 2 dropped grants (each at most %.0f)", lost, maxGrant)
	}
}
