package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
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

// TestBackendKilledMidQueryClosesClient: when the backend thread of a
// running statement is killed (KILL CONNECTION), the client gets error
// 1927 and then its socket is closed at once, so that it learns the
// connection is gone now, not at its next statement. Measured on a
// hand-made client (no driver between): the time from the ERR packet to
// EOF on the client's socket. Directly, MariaDB 10.11 sends no ERR: the
// socket just ends. (A driver on libmariadb keeps a connection after a
// server's error, so it learns the close at its next statement either
// way; go-sql-driver marks it bad at once.)
func TestBackendKilledMidQueryClosesClient(t *testing.T) {
	ts := startTokenServer(t)
	for _, tc := range []struct {
		name    string
		addr    func() string
		wantErr bool // an ERR 1927 comes before the socket's end
	}{
		{"direct", func() string { return backendAddr }, false},
		{"pass-through", func() string { return startProxy(t).Addr }, true},
		{"metered", func() string { return startMeteredProxy(t, ts).Addr }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := rawLogin(tc.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			mark := fmt.Sprintf("killme_%d", time.Now().UnixNano())
			if err := writeRaw(c, 0, append([]byte{gomysql.COM_QUERY}, "SELECT SLEEP(30) AS "+mark...)); err != nil {
				t.Fatal(err)
			}
			direct := openDB(t, backendAddr)
			var id int64
			for deadline := time.Now().Add(10 * time.Second); ; {
				err := direct.QueryRow("SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE ?", "SELECT SLEEP(30) AS "+mark).Scan(&id)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the statement never reached the backend: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			killAt := time.Now()
			if _, err := direct.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			var got []string
			var errAt time.Time
			for {
				_, p, err := readRaw(c)
				if err != nil {
					if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
						t.Fatalf("%v, not the socket's end (read %v)", err, got)
					}
					if errAt.IsZero() {
						if tc.wantErr {
							t.Fatalf("the socket ended (%v) without an ERR packet; read %v", err, got)
						}
						t.Logf("%s: %v, the socket's end (%v) %v after the KILL", tc.name, got, err, time.Since(killAt))
						return
					}
					delay := time.Since(errAt)
					t.Logf("%s: %v %v after the KILL, then the socket's end (%v) %v later", tc.name, got, errAt.Sub(killAt), err, delay)
					if delay > 100*time.Millisecond {
						t.Fatalf("the client's socket ended %v after the ERR packet", delay)
					}
					return
				}
				if code, state, msg, ok := rawErr(p); ok {
					got = append(got, fmt.Sprintf("ERR %d (%s) %s", code, state, msg))
					if errAt.IsZero() {
						errAt = time.Now()
					}
					if code != 1927 {
						t.Fatalf("the killed statement's error: %v, want 1927", got)
					}
					continue
				}
				got = append(got, fmt.Sprintf("packet %q", p))
			}
		})
	}
}
