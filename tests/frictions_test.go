package tests

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestFirstStatementInFreshGroupRunsAtOnce: the first statements of a
// limited group this proxy has not used yet run without waiting, since the
// group's bucket holds tokens to spare: rgserver's first grant to the
// proxy carries its share of the bucket at once (immediate_tokens). Before,
// the first statement waited for the grant's trickle (~19 ms in a 100 RU/s
// group). The wait measured is the proxy's own (THROTTLE_WAIT_MS).
func TestFirstStatementInFreshGroupRunsAtOnce(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP rg_fresh RU_PER_SEC = 100")
	ctx := context.Background()
	conn, err := openDB(t, px.Addr).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET RESOURCE GROUP rg_fresh"); err != nil {
		t.Fatal(err)
	}
	var waits []float64
	for i := 0; i < 5; i++ {
		if _, err := conn.ExecContext(ctx, "SELECT 1"); err != nil {
			t.Fatalf("statement %d: %v", i, err)
		}
		waits = append(waits, lastStatementWait(t, conn))
	}
	t.Logf("THROTTLE_WAIT_MS of the group's first statements on this proxy: %v", waits)
	if waits[0] > 5 {
		t.Fatalf("the first statement of a fresh group with tokens to spare waited %.2f ms (all: %v)", waits[0], waits)
	}
}

// TestStreamLossBridgesAtLastShare: a limited group driven at full speed
// keeps running near its share after rgserver is killed, until degraded
// mode takes over (--degraded-after, 5 s): the proxy goes on filling the
// group's bucket at its last share. Before, the group ran roughly
// [13 5 0 0 0] statements in the 5 s after the kill, of its 14/s.
func TestStreamLossBridgesAtLastShare(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", "1s")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP rg_bridge RU_PER_SEC = 10")
	db := openDB(t, px.Addr)
	const workers = 4
	db.SetMaxOpenConns(workers)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	var done []time.Time // when each statement finished without error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(ctx)
			if err != nil {
				return
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, "SET RESOURCE GROUP rg_bridge"); err != nil {
				t.Error(err)
				return
			}
			for ctx.Err() == nil {
				if _, err := conn.ExecContext(ctx, "SELECT 1"); err == nil {
					mu.Lock()
					done = append(done, time.Now())
					mu.Unlock()
				}
			}
		}()
	}
	count := func(from, to time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, d := range done {
			if !d.Before(from) && d.Before(to) {
				n++
			}
		}
		return n
	}
	// Steady state first: what the group runs under its limit.
	time.Sleep(3 * time.Second)
	m0 := time.Now()
	time.Sleep(3 * time.Second)
	kill := time.Now()
	share := float64(count(m0, kill)) / kill.Sub(m0).Seconds()
	ts.process.cmd.Process.Signal(syscall.SIGKILL)
	<-ts.process.done
	time.Sleep(5 * time.Second)
	cancel()
	wg.Wait()
	var perSec []int
	for i := range 5 {
		from := kill.Add(time.Duration(i) * time.Second)
		perSec = append(perSec, count(from, from.Add(time.Second)))
	}
	t.Logf("under the limit: %.1f statements/s; in each second after rgserver was killed: %v", share, perSec)
	if share < 5 {
		t.Fatalf("the group ran only %.1f statements/s before the kill", share)
	}
	for i, n := range perSec {
		if float64(n) < 0.5*share || float64(n) > 1.5*share+2 {
			t.Fatalf("second %d after the kill ran %d statements, not near the share of %.1f/s (all: %v)", i, n, share, perSec)
		}
	}
}
