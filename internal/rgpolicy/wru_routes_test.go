package rgpolicy

import (
	"math"
	"slices"
	"strconv"
	"testing"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
)

// TestWritesXAPaysAtPrepare: an XA transaction's rows are claimed at XA
// PREPARE (the log's group that holds them), less what its statements'
// packets paid; XA COMMIT claims nothing more; XA COMMIT ... ONE PHASE
// claims the transaction it commits; XA ROLLBACK before a prepare claims
// nothing.
func TestWritesXAPaysAtPrepare(t *testing.T) {
	ins := "INSERT INTO t (b) VALUES (@v)"
	tests := []struct {
		name      string
		stmts     []stmt
		gtid      string // @@last_gtid after the statements
		wantWRU   float64
		wantClaim []string
	}{
		{name: "XA PREPARE",
			stmts: []stmt{{q: "XA START 'a'", txnOut: true}, {q: ins, inTxn: true, txnOut: true, affected: 1},
				{q: "XA END 'a'", inTxn: true, txnOut: true}, {q: "XA PREPARE 'a'", inTxn: true, txnOut: true}},
			gtid: "0-1-5", wantWRU: float64(mib-len(ins)-1) / 1024, wantClaim: []string{"0-1-5"}},
		{name: "XA PREPARE, flags off",
			stmts: []stmt{{q: "XA START 'a'"}, {q: ins, affected: 1}, {q: "XA END 'a'"}, {q: "XA PREPARE 'a'"}},
			gtid:  "0-1-5", wantWRU: float64(mib-len(ins)-1) / 1024, wantClaim: []string{"0-1-5"}},
		{name: "XA COMMIT ONE PHASE",
			stmts: []stmt{{q: "XA START 'a'", txnOut: true}, {q: ins, inTxn: true, txnOut: true, affected: 1},
				{q: "XA END 'a'", inTxn: true, txnOut: true}, {q: "XA COMMIT 'a' ONE PHASE", inTxn: true}},
			gtid: "0-1-5", wantWRU: 2 + float64(mib-len(ins)-1)/1024, wantClaim: []string{"0-1-5"}},
		{name: "XA ROLLBACK",
			stmts: []stmt{{q: "XA START 'a'", txnOut: true}, {q: ins, inTxn: true, txnOut: true, affected: 1},
				{q: "XA END 'a'", inTxn: true, txnOut: true}, {q: "XA ROLLBACK 'a'", inTxn: true}},
			gtid: "0-1-5", wantWRU: 0, wantClaim: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bl := &fakeBinlog{attr: binlog.AttributeGTID, txns: map[string]int64{tc.gtid: mib}}
			p := newWritesPolicy(t, testGroups(), WriteAuto, bl, clock.NewFake(), nil)
			s := p.Open(mysqlproto.SessionInfo{User: "root"})
			be := &sessionBackend{gtid: tc.gtid}
			for _, x := range tc.stmts {
				runStmt(t, s, be, x)
			}
			if got := wruOf(t, showLast(t, s)); math.Abs(got-tc.wantWRU) > 0.01 {
				t.Errorf("last statement WRU %v, want %v", got, tc.wantWRU)
			}
			if !slices.Equal(bl.claims, tc.wantClaim) {
				t.Errorf("claims %q, want %q", bl.claims, tc.wantClaim)
			}
			// The XA COMMIT of a prepared transaction claims nothing.
			be.gtid = "0-1-6"
			bl.txns["0-1-6"] = 0
			runStmt(t, s, be, stmt{q: "XA COMMIT 'a'"})
			if !slices.Equal(bl.claims, tc.wantClaim) {
				t.Errorf("after XA COMMIT: claims %q, want %q", bl.claims, tc.wantClaim)
			}
		})
	}
}

// TestWritesSeveralTransactions: a multi-statement packet (or a CALL)
// pays what the session's Binlog_bytes_written grew by, less its text
// when the log annotates rows events with it, and claims no GTID.
func TestWritesSeveralTransactions(t *testing.T) {
	multi := "INSERT INTO t (b) SELECT REPEAT('x', 1048576); INSERT INTO t (b) VALUES ('x')"
	pk := float64(len(multi) + 1)
	tests := []struct {
		name     string
		x        stmt
		before   int64
		after    int64
		annotate string
		wantWRU  float64
	}{
		{"annotated", stmt{q: multi, affected: 1}, 100, 100 + mib + int64(pk) + 300, "1", 2 + (mib+300)/1024.0},
		{"not annotated", stmt{q: multi, affected: 1}, 100, 100 + mib + 300, "0", 2 + (mib+300)/1024.0},
		{"CALL", stmt{q: "CALL p()", affected: 1}, 0, mib + 300 + 9, "1", 2 + (mib+300)/1024.0},
		// DDL commits the open transaction first: two transactions.
		{"implicit commit", stmt{q: "CREATE TABLE x (a INT)", inTxn: true}, 0, mib + 300 + int64(len("CREATE TABLE x (a INT)")+1), "1",
			2 + (mib+300)/1024.0},
		{"nothing logged", stmt{q: multi, affected: 1}, 100, 100, "1", 2 + pk/1024},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The last transaction (INSERT 'x') is in the log: claiming
			// it alone would pay 1 byte.
			bl := &fakeBinlog{attr: binlog.AttributeGTID, txns: map[string]int64{"0-1-9": 1}}
			p := newWritesPolicy(t, testGroups(), WriteAuto, bl, clock.NewFake(), nil)
			s := p.Open(mysqlproto.SessionInfo{User: "root"})
			be := &sessionBackend{gtid: "0-1-9", annotate: tc.annotate,
				logged: []string{strconv.FormatInt(tc.before, 10), strconv.FormatInt(tc.after, 10)}}
			runStmt(t, s, be, tc.x)
			row := showLast(t, s)
			if got := wruOf(t, row); math.Abs(got-tc.wantWRU) > 0.01 {
				t.Errorf("WRU %v (%s), want %v", got, row["WRU_SOURCE"], tc.wantWRU)
			}
			if len(bl.claims) != 0 || len(be.queries) != 2 {
				t.Errorf("claims %q, queries %q: want none and two", bl.claims, be.queries)
			}
			// The session's last GTID is known: a write that commits
			// nothing new claims nothing.
			runStmt(t, s, be, stmt{q: "UPDATE t SET b = 1 WHERE id = 0"})
			if len(bl.claims) != 0 {
				t.Errorf("claims %q after an UPDATE that committed nothing", bl.claims)
			}
		})
	}
}

// TestWritesEstimateUserVariables: without a binary log, a write that
// reads user variables pays at least affected rows × their size, into a
// table whose average row length is unknown (new, small) too.
func TestWritesEstimateUserVariables(t *testing.T) {
	p := newWritesPolicy(t, testGroups(), WriteEstimate, nil, clock.NewFake(), nil)
	s := p.Open(mysqlproto.SessionInfo{User: "root"})
	be := &sessionBackend{db: "db", avg: map[string]string{}, varLen: strconv.Itoa(mib)}
	for _, tc := range []struct {
		x    stmt
		want float64
		ask  string // the variables' query, "" = none
	}{
		{stmt{q: "INSERT INTO n (b) VALUES (@v)", affected: 1}, 2 + mib/1024.0, "SELECT 0 + COALESCE(LENGTH(@v), 0)"},
		{stmt{q: "INSERT INTO n (b) SELECT @V FROM seq_1_to_3", affected: 3}, 2 + 3*mib/1024.0, "SELECT 0 + COALESCE(LENGTH(@v), 0)"},
		{stmt{q: "UPDATE n SET b = @`v`", affected: 1}, 2 + mib/1024.0,
			"SELECT COALESCE(SUM(LENGTH(VARIABLE_VALUE)), 0) FROM information_schema.USER_VARIABLES"},
		{stmt{q: "DELETE FROM n WHERE b = @v", affected: 1}, 2 + float64(len("DELETE FROM n WHERE b = @v")+1)/1024, ""},
		{stmt{q: "INSERT INTO n (b) VALUES ('x')", affected: 1}, 2 + float64(len("INSERT INTO n (b) VALUES ('x')")+1)/1024, ""},
	} {
		be.queries = nil
		runStmt(t, s, be, tc.x)
		if got := wruOf(t, showLast(t, s)); math.Abs(got-tc.want) > 0.01 {
			t.Errorf("%s: WRU %v, want %v", tc.x.q, got, tc.want)
		}
		if asked := slices.Contains(be.queries, tc.ask); tc.ask != "" && !asked {
			t.Errorf("%s: queries %q, want %q", tc.x.q, be.queries, tc.ask)
		}
		if tc.ask == "" && len(be.queries) > 1 {
			t.Errorf("%s: queries %q, want the table's lookup at most", tc.x.q, be.queries)
		}
	}
}
