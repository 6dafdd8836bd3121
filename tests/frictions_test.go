package tests

import (
	"context"
	"testing"
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
