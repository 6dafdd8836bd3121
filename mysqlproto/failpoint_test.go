package mysqlproto

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pingcap/failpoint"

	"github.com/rgproxy/rgproxy/internal/fptest"
)

const fpPkg = "github.com/rgproxy/rgproxy/mysqlproto/"

// needFailpoints skips a test unless `make test-failpoints` compiled the
// markers in; there it must run.
func needFailpoints(t *testing.T) { fptest.Need(t, fpPkg, failpointsCompiledIn) }

func enable(t *testing.T, name, term string) { fptest.Enable(t, fpPkg, name, term) }

// A failed backend dial reaches the client as an ERR naming the backend;
// a session already open keeps working, and the next session logs in.
func TestFailpointBackendDialError(t *testing.T) {
	needFailpoints(t)
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	open := openDB(t, addr)
	open.SetMaxOpenConns(1)
	if err := open.Ping(); err != nil {
		t.Fatal(err)
	}
	enable(t, "backendDialError", "return(true)")
	err := openDB(t, addr).Ping()
	if err == nil || !strings.Contains(err.Error(), "cannot connect to backend "+backendAddr) {
		t.Fatalf("ping under the fault: %v", err)
	}
	var got int
	if err := open.QueryRow("SELECT 7").Scan(&got); err != nil || got != 7 {
		t.Fatalf("open session under the fault: %d %v", got, err)
	}
	failpoint.Disable(fpPkg + "backendDialError")
	if err := openDB(t, addr).Ping(); err != nil {
		t.Fatalf("after the fault: %v", err)
	}
}

// A backend that fails in the middle of a result gives the client the
// rows relayed so far, then 1927, and ends the session; a new session
// works.
func TestFailpointBackendReadError(t *testing.T) {
	needFailpoints(t)
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	db := openDB(t, addr)
	db.SetMaxOpenConns(1)
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	// 200 bytes: past the column definitions, inside the rows.
	enable(t, "backendReadError", "return(200)")
	rows, err := db.Query("SELECT seq FROM seq_1_to_1000")
	if err != nil {
		t.Fatalf("query under the fault: %v", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	err = rows.Err()
	rows.Close()
	if err == nil || !strings.Contains(err.Error(), "1927") || n == 0 || n >= 1000 {
		t.Fatalf("under the fault: %d rows, then %v; want some rows, then 1927", n, err)
	}
	failpoint.Disable(fpPkg + "backendReadError")
	var a, b int
	if err := openDB(t, addr).QueryRow("SELECT 1, 2").Scan(&a, &b); err != nil || a != 1 || b != 2 {
		t.Fatalf("new session: %d %d %v", a, b, err)
	}
}

// A client that stalls on its writes does not make its statements look
// slow on the backend (BackendTime leaves the stall out), and stalled
// sessions do not wait for each other.
func TestFailpointClientWriteStall(t *testing.T) {
	needFailpoints(t)
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	const sessions = 3
	dbs := make([]*sql.DB, sessions)
	for i := range dbs {
		dbs[i] = openDB(t, addr)
		dbs[i].SetMaxOpenConns(1)
		if err := dbs[i].Ping(); err != nil {
			t.Fatal(err)
		}
	}
	const stall = 300 * time.Millisecond
	enable(t, "clientWriteStall", "return(300)")
	start := time.Now()
	errs := make(chan error, sessions)
	for i, db := range dbs {
		go func() {
			var got int
			err := db.QueryRow(fmt.Sprintf("SELECT %d", 40+i)).Scan(&got)
			if err == nil && got != 40+i {
				err = fmt.Errorf("got %d", got)
			}
			errs <- err
		}()
	}
	for range dbs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	failpoint.Disable(fpPkg + "clientWriteStall")
	if took < stall {
		t.Fatalf("queries took %v; the stall did not happen", took)
	}
	// Serialized, three stalls would take 900 ms.
	if took >= sessions*stall {
		t.Fatalf("%d stalled sessions took %v: they waited for each other", sessions, took)
	}
	// After runs once the reply is on its way: wait for each outcome.
	for i := range dbs {
		r := pol.waitOutcome(t, fmt.Sprintf("SELECT %d", 40+i))
		if r.out.BackendTime >= stall {
			t.Fatalf("%s: BackendTime %v includes the %v stall", r.st.Query, r.out.BackendTime, stall)
		}
	}
}
