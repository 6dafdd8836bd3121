package tests

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// debtSetup is a metering proxy with --max-wait maxWait, the account
// debt_app bound to debt_rg20 (20 RU/s, no burst), and debt_rg_other
// beside it.
func debtSetup(t *testing.T, maxWait string) *proxy {
	t.Helper()
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", maxWait, "--max-wait-in-txn", "100ms", "--write-source", "packet")
	appUser(t, "debt_app")
	rootExec(t, "CREATE TABLE IF NOT EXISTS rgproxy_e2e.debt_rows (id INT AUTO_INCREMENT PRIMARY KEY, b MEDIUMTEXT)")
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP debt_rg20 RU_PER_SEC = 20",
		"CREATE RESOURCE GROUP debt_rg_other RU_PER_SEC = 20",
		"ALTER USER 'debt_app'@'%' RESOURCE GROUP debt_rg20")
	return px
}

// debtInsert is an INSERT whose before-cost is about 11 RU (2 + its
// 9 KiB), half a second of debt_rg20's rate.
var debtInsert = "INSERT INTO debt_rows (b) VALUES ('" + strings.Repeat("x", 9*1024) + "')"

// endOwing runs n sessions of user at once, each in a transaction
// (BEGIN, then debtInsert, which finds the group's bucket empty), and
// disconnects them all without COMMIT. It returns how many INSERTs ran
// (on their session's debt, or with tokens) and how many were refused.
func endOwing(t *testing.T, px *proxy, user string, n int) (ran, refused int) {
	t.Helper()
	params := []string{"user=" + user, "password=apppw"}
	if user == "root" {
		params = nil
	}
	db := openDB(t, px.Addr, params...)
	db.SetMaxIdleConns(0) // a connection given back is closed: the session ends
	var okN, refusedN atomic.Int64
	var begun, inserted, wg sync.WaitGroup
	begun.Add(n)
	inserted.Add(n)
	ctx := context.Background()
	conns := make([]*sql.Conn, n)
	for i := range conns {
		// One at a time: rgproxy admits 16 logins at once per host.
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close() // disconnects inside the transaction
			var err error
			if user == "root" {
				_, err = conn.ExecContext(ctx, "SET RESOURCE GROUP debt_rg20")
			}
			if err == nil {
				_, err = conn.ExecContext(ctx, "BEGIN")
			}
			begun.Done()
			if err != nil {
				t.Errorf("BEGIN: %v", err)
				inserted.Done()
				return
			}
			begun.Wait() // no session's BEGIN repays another's debt
			_, err = conn.ExecContext(ctx, debtInsert)
			switch {
			case err == nil:
				okN.Add(1)
			case mysqlErrNo(err) == 8252:
				refusedN.Add(1)
			default:
				t.Errorf("INSERT inside the transaction: %v", err)
			}
			inserted.Done()
			inserted.Wait() // all end together
		}()
	}
	wg.Wait()
	db.Close()
	return int(okN.Load()), int(refusedN.Load())
}

// owedRefusal is 8252 for a debt the statement's wait could not pay:
// what the user owes, when it clears, what the statement paid.
var owedRefusal = regexp.MustCompile(`the user debt_app owes ([0-9.]+) RU its sessions ran on debt inside transactions ` +
	`and clears in about ([0-9.]+m?s) at its RU_PER_SEC 20`)

// clearsSeconds parses a duration of owedRefusal ("3s", "757ms").
func clearsSeconds(t *testing.T, s string) float64 {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return d.Seconds()
}

// TestDebtNeverLocksOut: twenty sessions of one account in a 20 RU/s
// group end owing (inside transactions, disconnected); the account's
// next statement runs within a few seconds of the rate. With --max-wait
// 30s it waits for the debt once; with --max-wait 1s each attempt pays
// what its second can, gets 8252 saying what is still owed and when it
// clears, and a client that retries runs within about that time. Before
// (issue 29), the ledger summed the twenty sessions' debts without a
// bound: the next statement waited about 11 s (--max-wait 30s), or got
// "can never fit" at every attempt (--max-wait 1s).
func TestDebtNeverLocksOut(t *testing.T) {
	for _, maxWait := range []string{"30s", "1s"} {
		t.Run("--max-wait "+maxWait, func(t *testing.T) {
			px := debtSetup(t, maxWait)
			ran, refused := endOwing(t, px, "debt_app", 20)
			t.Logf("20 sessions in transactions: %d INSERTs ran (on debt, or with tokens), %d refused with 8252 for the account's bound", ran, refused)
			if ran < 2 {
				t.Fatalf("%d INSERTs ran inside the transactions: the scenario needs some on debt", ran)
			}
			db := openDB(t, px.Addr, "user=debt_app", "password=apppw")
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			attempts, firstOwed, firstClears, lastOwed := 0, 0.0, 0.0, 0.0
			for {
				attempts++
				_, err := conn.ExecContext(ctx, "SELECT 1")
				if err == nil {
					break
				}
				if mysqlErrNo(err) != 8252 || time.Since(start) > 20*time.Second {
					t.Fatalf("attempt %d, %v after the first: %v", attempts, time.Since(start).Round(time.Millisecond), err)
				}
				m := owedRefusal.FindStringSubmatch(err.Error())
				if m == nil {
					if strings.Contains(err.Error(), "owes") || attempts > 1 && lastOwed > 0 && lastOwed < 25 {
						// The debt is paid; the wait went to it, and the
						// statement's own 0.625 RU waits for the next one.
						t.Logf("attempt %d: %v", attempts, err)
						continue
					}
					t.Fatalf("attempt %d: %v, want what the account owes and when it clears", attempts, err)
				}
				owed, clears := num(t, m[1]), clearsSeconds(t, m[2])
				t.Logf("attempt %d: %v", attempts, err)
				if attempts == 1 {
					firstOwed, firstClears = owed, clears
				} else if owed >= lastOwed {
					t.Errorf("attempt %d: owes %v RU, %v before: a retry paid nothing", attempts, owed, lastOwed)
				}
				lastOwed = owed
			}
			took := time.Since(start)
			row := lastStatementRU(t, conn)
			t.Logf("--max-wait %s: the account's next statement ran after %v (%d attempts; the last waited %s ms in rgproxy)",
				maxWait, took.Round(time.Millisecond), attempts, row["THROTTLE_WAIT_MS"])
			if attempts > 1 {
				t.Logf("the first refusal said %v RU still owed, clearing in %v s", firstOwed, firstClears)
			}
			// Three seconds of the rate (the account's bound) and what the
			// group's bucket owed; slack for a loaded machine.
			if took > 6*time.Second {
				t.Errorf("the account's next statement ran after %v, want within about 3 s of the rate", took)
			}
			if maxWait == "30s" && (attempts != 1 || took < 500*time.Millisecond) {
				t.Errorf("with --max-wait 30s: %d attempts in %v, want one that waited for the debt", attempts, took)
			}
			if maxWait == "1s" && (attempts < 2 || firstOwed <= 0 || firstOwed > 3*20+5 || firstClears > 4 || took.Seconds() > firstClears+3) {
				t.Errorf("with --max-wait 1s: %d attempts in %v; the first refusal said %v RU owed, clears in %v s",
					attempts, took, firstOwed, firstClears)
			}
		})
	}
}

// TestDebtNeverRefusesRebindOrAdmin: while debt_app and root owe
// debt_rg20 more than --max-wait 1s pays, rgproxy's own statements
// (CURRENT_RESOURCE_GROUP(), SET RESOURCE GROUP, SHOW LAST STATEMENT RU,
// SHOW RESOURCE GROUP USAGE) and the administrator's (CREATE / ALTER
// RESOURCE GROUP, ALTER USER ... RESOURCE GROUP) are answered, and once
// debt_app is bound to another group its statements run there at once;
// bound back, it still owes the old group. Before, CURRENT_RESOURCE_GROUP()
// and every statement after the rebind got 8252 for the debt.
func TestDebtNeverRefusesRebindOrAdmin(t *testing.T) {
	px := debtSetup(t, "1s")
	ran, _ := endOwing(t, px, "debt_app", 20)
	rootRan, _ := endOwing(t, px, "root", 3)
	t.Logf("inside transactions, %d INSERTs of debt_app and %d of root ran", ran, rootRan)
	ctx := context.Background()
	appDB := openDB(t, px.Addr, "user=debt_app", "password=apppw")
	appDB.SetMaxIdleConns(0) // closing the connection ends the session
	app, err := appDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	root := rootConn(t, px.Addr)
	steps := []struct {
		conn *sql.Conn
		who  string
		q    string
		want string // the single cell answered, "" = any
	}{
		{app, "debt_app", "SELECT CURRENT_RESOURCE_GROUP()", "debt_rg20"},
		{app, "debt_app", "SET RESOURCE GROUP debt_rg20", ""},
		{app, "debt_app", "SHOW RESOURCE GROUP USAGE", ""},
		{app, "debt_app", "SHOW LAST STATEMENT RU", ""},
		{root, "root", "SET RESOURCE GROUP debt_rg20", ""},
		{root, "root", "SELECT CURRENT_RESOURCE_GROUP()", "debt_rg20"},
		{root, "root", "CREATE RESOURCE GROUP debt_rg_new RU_PER_SEC = 10", ""},
		{root, "root", "ALTER RESOURCE GROUP debt_rg_new RU_PER_SEC = 30", ""},
		{root, "root", "SHOW CREATE RESOURCE GROUP debt_rg20", ""},
		{root, "root", "ALTER USER 'debt_app'@'%' RESOURCE GROUP debt_rg_other", ""},
	}
	for _, s := range steps {
		start := time.Now()
		var cell string
		err := s.conn.QueryRowContext(ctx, s.q).Scan(&cell)
		if err == sql.ErrNoRows {
			err = nil
		} else if err != nil && strings.Contains(err.Error(), "expected") {
			err = sqlRun(s.conn, s.q) // more than one column, or none
		}
		if err != nil {
			t.Errorf("%s: %s: %v", s.who, s.q, err)
			continue
		}
		if s.want != "" && cell != s.want {
			t.Errorf("%s: %s = %q, want %q", s.who, s.q, cell, s.want)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("%s: %s took %v: it waited", s.who, s.q, d)
		}
	}
	// Rebound, in a new session (the old one ended: what the account
	// owes is all in the ledger), it runs in its new group at once.
	app.Close()
	other, err := openDB(t, px.Addr, "user=debt_app", "password=apppw").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	start := time.Now()
	for i := range 5 {
		if err := sqlRun(other, fmt.Sprintf("SELECT %d", i)); err != nil {
			t.Fatalf("after the rebind, statement %d: %v", i, err)
		}
	}
	t.Logf("after the rebind to debt_rg_other: 5 statements in %v", time.Since(start).Round(time.Millisecond))
	var g string
	if err := other.QueryRowContext(ctx, "SELECT CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil || g != "debt_rg_other" {
		t.Fatalf("after the rebind: CURRENT_RESOURCE_GROUP() = %q, %v", g, err)
	}
	// Bound back: the debt to debt_rg20 is still owed.
	adminExec(t, px.Addr, "ALTER USER 'debt_app'@'%' RESOURCE GROUP debt_rg20")
	back, err := openDB(t, px.Addr, "user=debt_app", "password=apppw").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	err = sqlRun(back, "SELECT 1")
	if m := owedRefusal.FindStringSubmatch(fmt.Sprint(err)); m == nil {
		t.Errorf("bound back to debt_rg20: %v, want 8252 for what the account still owes", err)
	} else if owed, _ := strconv.ParseFloat(m[1], 64); owed <= 0 || owed > 3*20+5 {
		t.Errorf("bound back: the account owes %v RU, want within three seconds of the rate", owed)
	}
}
