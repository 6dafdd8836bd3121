package rgpolicy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
)

// fakeBinlog stands for internal/binlog.Reader: txns are the transactions
// its log showed (bytes by GTID, or by "t<id>" for a thread); a claim of
// one it has not shown waits in pending until the test resolves it.
type fakeBinlog struct {
	attr    binlog.Attribution
	txns    map[string]int64
	pending map[string]func(binlog.Result)
	claims  []string
}

func (f *fakeBinlog) Attribution() binlog.Attribution { return f.attr }

func (f *fakeBinlog) ClaimGTID(g string, done func(binlog.Result)) { f.claim(g, done) }

func (f *fakeBinlog) ClaimThread(id uint32, done func(binlog.Result)) {
	f.claim("t"+strconv.FormatUint(uint64(id), 10), done)
}

func (f *fakeBinlog) claim(k string, done func(binlog.Result)) {
	f.claims = append(f.claims, k)
	if b, ok := f.txns[k]; ok {
		delete(f.txns, k)
		done(binlog.Result{Found: true, Bytes: b, Txns: 1})
		return
	}
	if f.pending == nil {
		f.pending = map[string]func(binlog.Result){}
	}
	f.pending[k] = done
}

// sessionBackend answers the policy's write queries as a MariaDB session
// would: @@last_gtid, and a table's average row length.
type sessionBackend struct {
	gtid string
	db   string
	avg  map[string]string // hex-encoded table name → AVG_ROW_LENGTH
	// varLen is what the user variables a statement reads hold ("" = 0).
	varLen string
	// logged is Binlog_bytes_written, one value per query (the last
	// stays); annotate is @@binlog_annotate_row_events.
	logged   []string
	annotate string
	queries  []string
}

// tableLookups is how many of the queries asked for a table's average
// row length.
func (b *sessionBackend) tableLookups() int {
	n := 0
	for _, q := range b.queries {
		if strings.HasPrefix(q, "SELECT DATABASE()") {
			n++
		}
	}
	return n
}

func (b *sessionBackend) Query(_ context.Context, sql string) ([]string, [][]*string, error) {
	b.queries = append(b.queries, sql)
	switch {
	case sql == "SELECT @@last_gtid":
		g := b.gtid
		return []string{"@@last_gtid"}, [][]*string{{&g}}, nil
	case strings.HasPrefix(sql, "SELECT DATABASE(), (SELECT IF(DATA_LENGTH >= 1048576, AVG_ROW_LENGTH, 0)"):
		db := b.db
		var avg *string
		for k, v := range b.avg {
			if strings.Contains(sql, "TABLE_NAME = X'"+k+"'") {
				avg = &v
			}
		}
		return []string{"DATABASE()", "avg"}, [][]*string{{&db, avg}}, nil
	case strings.HasPrefix(sql, "SELECT 0 + COALESCE(LENGTH(@"), strings.Contains(sql, "information_schema.USER_VARIABLES"):
		v := b.varLen
		if v == "" {
			v = "0"
		}
		return []string{"n"}, [][]*string{{&v}}, nil
	case strings.Contains(sql, "information_schema.SESSION_STATUS") && len(b.logged) > 0:
		v := b.logged[0]
		if len(b.logged) > 1 {
			b.logged = b.logged[1:]
		}
		if strings.HasPrefix(sql, "SELECT @@last_gtid, ") {
			g, a := b.gtid, b.annotate
			return []string{"g", "v", "a"}, [][]*string{{&g, &v, &a}}, nil
		}
		return []string{"v"}, [][]*string{{&v}}, nil
	}
	return nil, nil, errors.New("unexpected query " + sql)
}

func newWritesPolicy(t *testing.T, tok *recordingTokens, src WriteSource, bl Binlog, clk clock.Clock, reg prometheus.Registerer) *Policy {
	t.Helper()
	cfg := Config{Tokens: tok, Settings: Settings{MaxWait: 30 * time.Second, MaxWaitInTxn: 100 * time.Millisecond},
		CPU: CPUWall, Writes: src, Clock: clk, Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if bl != nil {
		cfg.Binlog = bl
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stmt is one statement a test runs through a session: its text, whether
// a transaction was open before and after it, and what the backend said.
type stmt struct {
	q             string
	inTxn, txnOut bool
	affected      uint64
	errCode       uint16
	payload       int64 // PayloadBytes; default len(q)+1
}

func runStmt(t *testing.T, s mysqlproto.SessionPolicy, be mysqlproto.Backend, x stmt) {
	t.Helper()
	st := query(x.q)
	st.InTransaction = x.inTxn
	if x.payload > 0 {
		st.PayloadBytes = x.payload
	}
	if v := s.Before(context.Background(), st, be); v.Reply != nil {
		t.Fatalf("%s answered: %+v", x.q, v.Reply.Err)
	}
	out := &mysqlproto.Outcome{RequestBytes: st.PayloadBytes, AffectedRows: x.affected, ErrCode: x.errCode, InTransaction: x.txnOut}
	s.After(st, out)
	s.(mysqlproto.FollowUpper).FollowUp(context.Background(), st, out, be)
}

// showLast runs SHOW LAST STATEMENT RU and returns its row by column.
func showLast(t *testing.T, s mysqlproto.SessionPolicy) map[string]string {
	t.Helper()
	v := s.Before(context.Background(), query("SHOW LAST STATEMENT RU"), nil)
	if v.Reply == nil || len(v.Reply.Rows) != 1 {
		t.Fatalf("SHOW LAST STATEMENT RU: %+v", v)
	}
	row := map[string]string{}
	for i, c := range v.Reply.Columns {
		row[c] = *v.Reply.Rows[0][i]
	}
	return row
}

func wruOf(t *testing.T, row map[string]string) float64 {
	t.Helper()
	return num(t, row["WRU"])
}

func num(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return v
}

const mib = 1 << 20

// TestWritesFromTheBinlog: with a binary log, each route of a 1 MiB write
// costs what the log shows it wrote, as the literal does, and the routes
// that cannot write ask nothing.
func TestWritesFromTheBinlog(t *testing.T) {
	literal := "INSERT INTO t (b) VALUES ('" + strings.Repeat("x", 64) + "')" // its payload is set to 1 MiB below
	tests := []struct {
		name    string
		stmts   []stmt
		gtid    string // @@last_gtid after the last statement
		logged  int64  // what the log shows for it
		wantWRU float64
		source  string
		asks    int // @@last_gtid queries
	}{
		{name: "literal: the packet already paid for its bytes",
			stmts: []stmt{{q: literal, affected: 1, payload: mib + 40}}, gtid: "0-1-5", logged: mib + 4,
			wantWRU: 2 + float64(mib+40)/1024, source: "binlog", asks: 1},
		{name: "INSERT VALUES (@v) pays the row it wrote",
			stmts: []stmt{{q: "INSERT INTO t (b) VALUES (@v)", affected: 1}}, gtid: "0-1-5", logged: mib + 4,
			wantWRU: 2 + float64(mib+4)/1024, source: "binlog", asks: 1},
		{name: "EXECUTE IMMEDIATE (an other statement) pays its row",
			stmts: []stmt{{q: "EXECUTE IMMEDIATE 'INSERT INTO t (b) VALUES (?)' USING @v", affected: 1}}, gtid: "0-1-5", logged: mib,
			wantWRU: float64(mib) / 1024, source: "binlog", asks: 1},
		{name: "the transaction's bytes are settled by its COMMIT",
			stmts: []stmt{{q: "BEGIN", txnOut: true}, {q: "INSERT INTO t (b) VALUES (@v)", inTxn: true, txnOut: true, affected: 1},
				{q: "SELECT 1", inTxn: true, txnOut: true}, {q: "COMMIT", inTxn: true}},
			gtid: "0-1-5", logged: mib + 4,
			// COMMIT's own 2 WRU plus the log's bytes less the INSERT's 30.
			wantWRU: 2 + float64(mib+4-len("INSERT INTO t (b) VALUES (@v)")-1)/1024, source: "binlog", asks: 1},
		{name: "a write the log does not show keeps its packet",
			stmts: []stmt{{q: "UPDATE t SET b = @v WHERE id = 0"}}, gtid: "", logged: 0,
			wantWRU: 2 + float64(len("UPDATE t SET b = @v WHERE id = 0")+1)/1024, source: "packet", asks: 1},
		{name: "SET and SELECT ask nothing",
			stmts: []stmt{{q: "SET @v = REPEAT('x', 10)"}, {q: "SELECT @v"}}, gtid: "0-1-5", logged: mib,
			wantWRU: 0, source: "packet", asks: 0},
		{name: "a statement inside a transaction waits for its end",
			stmts: []stmt{{q: "INSERT INTO t (b) VALUES (@v)", inTxn: true, txnOut: true, affected: 1}}, gtid: "0-1-5", logged: mib,
			wantWRU: 2 + float64(len("INSERT INTO t (b) VALUES (@v)")+1)/1024, source: "packet", asks: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := testGroups()
			bl := &fakeBinlog{attr: binlog.AttributeGTID, txns: map[string]int64{tc.gtid: tc.logged}}
			p := newWritesPolicy(t, tok, WriteAuto, bl, clock.NewFake(), nil)
			s := p.Open(mysqlproto.SessionInfo{User: "root"})
			be := &sessionBackend{gtid: tc.gtid}
			for _, x := range tc.stmts {
				runStmt(t, s, be, x)
			}
			row := showLast(t, s)
			if got := wruOf(t, row); math.Abs(got-tc.wantWRU) > 0.001 || row["WRU_SOURCE"] != tc.source {
				t.Errorf("WRU %v (%s), want %v (%s)", got, row["WRU_SOURCE"], tc.wantWRU, tc.source)
			}
			if len(be.queries) != tc.asks {
				t.Errorf("queries %q, want %d @@last_gtid", be.queries, tc.asks)
			}
			if p.WriteSourceInForce() != "binlog" {
				t.Errorf("source in force %s", p.WriteSourceInForce())
			}
		})
	}
}

// TestWritesClaimTheSameGTIDOnce: a write after which @@last_gtid has not
// moved (it committed nothing new) claims nothing.
func TestWritesClaimTheSameGTIDOnce(t *testing.T) {
	tok := testGroups()
	bl := &fakeBinlog{attr: binlog.AttributeGTID, txns: map[string]int64{"0-1-5": mib}}
	p := newWritesPolicy(t, tok, WriteAuto, bl, clock.NewFake(), nil)
	s := p.Open(mysqlproto.SessionInfo{User: "root"})
	be := &sessionBackend{gtid: "0-1-5"}
	runStmt(t, s, be, stmt{q: "INSERT INTO t SELECT * FROM u", affected: 1})
	runStmt(t, s, be, stmt{q: "DELETE FROM t WHERE 0"})
	if len(bl.claims) != 1 {
		t.Fatalf("claims %q, want one", bl.claims)
	}
	if row := showLast(t, s); row["WRU_SOURCE"] != "packet" {
		t.Fatalf("the DELETE's source %s", row["WRU_SOURCE"])
	}
}

// TestWritesPendingClaim: the log's events come after the OK; SHOW LAST
// STATEMENT RU waits for them (up to 100 ms of the injected clock), and
// the charge, made when they come, goes to the statement's group.
func TestWritesPendingClaim(t *testing.T) {
	tok := testGroups()
	bl := &fakeBinlog{attr: binlog.AttributeGTID}
	clk := clock.NewFake()
	reg := prometheus.NewRegistry()
	p := newWritesPolicy(t, tok, WriteAuto, bl, clk, reg)
	s := p.Open(mysqlproto.SessionInfo{User: "root"})
	be := &sessionBackend{gtid: "0-1-7"}
	runStmt(t, s, be, stmt{q: "INSERT INTO t (b) VALUES (@v)", affected: 1})
	charges := len(tok.amounts)
	if len(bl.pending) != 1 {
		t.Fatalf("pending %d", len(bl.pending))
	}
	// Nothing comes within 100 ms: the figure shown is not final.
	rows := make(chan map[string]string)
	go func() { rows <- showLast(t, s) }()
	for clk.Pending() == 0 {
		runtime.Gosched()
	}
	clk.Advance(showLastWait)
	if row := <-rows; row["WRU_SOURCE"] != "binlog pending" || wruOf(t, row) != 2.029 {
		t.Fatalf("pending: %v", row)
	}
	// The events come; SHOW LAST STATEMENT RU has the final figure at once.
	bl.pending["0-1-7"](binlog.Result{Found: true, Bytes: mib + 4, Txns: 1})
	row := showLast(t, s)
	if want := 2 + float64(mib+4)/1024; math.Abs(wruOf(t, row)-want) > 0.001 || row["WRU_SOURCE"] != "binlog" {
		t.Fatalf("resolved: %v, want WRU %v", row, want)
	}
	if n := len(tok.amounts); n != charges+1 || tok.charged[n-1] != "default" || math.Abs(tok.amounts[n-1]-float64(mib+4-30)/1024) > 0.001 {
		t.Fatalf("charges %v to %v", tok.amounts, tok.charged)
	}
	if got := testutil.ToFloat64(p.metrics.written.WithLabelValues("default", "binlog")); got != float64(mib+4-30) {
		t.Errorf("written bytes from the binlog %v", got)
	}
	if got := testutil.ToFloat64(p.metrics.written.WithLabelValues("default", "packet")); got != 30 {
		t.Errorf("written bytes from the packet %v", got)
	}
	if got := testutil.ToFloat64(p.metrics.ruConsumed.WithLabelValues("default", "wru")); math.Abs(got-(2+float64(mib+4)/1024)) > 0.001 {
		t.Errorf("rgproxy_ru_consumed_total{type=wru} %v", got)
	}
	// A claim the log never answers leaves the packet.
	runStmt(t, s, be, stmt{q: "INSERT INTO t (b) VALUES (@v)", affected: 1})
	be.gtid = "0-1-8"
	runStmt(t, s, be, stmt{q: "INSERT INTO t (b) VALUES (@v)", affected: 1})
	bl.pending["0-1-8"](binlog.Result{})
	if row := showLast(t, s); row["WRU_SOURCE"] != "packet" || wruOf(t, row) != 2.029 {
		t.Fatalf("unanswered: %v", row)
	}
}

// TestWritesByThread: on MySQL a session claims by its connection id, with
// no query.
func TestWritesByThread(t *testing.T) {
	tok := testGroups()
	bl := &fakeBinlog{attr: binlog.AttributeThread, txns: map[string]int64{"t7": mib}}
	p := newWritesPolicy(t, tok, WriteBinlog, bl, clock.NewFake(), nil)
	s := p.Open(mysqlproto.SessionInfo{User: "root", BackendConnID: 7})
	be := &sessionBackend{}
	runStmt(t, s, be, stmt{q: "CALL p()", affected: 1})
	if row := showLast(t, s); row["WRU_SOURCE"] != "binlog" || math.Abs(wruOf(t, row)-(2+1024)) > 0.001 {
		t.Fatalf("CALL: %v", row)
	}
	if len(be.queries) != 0 || len(bl.claims) != 1 {
		t.Fatalf("queries %q, claims %q", be.queries, bl.claims)
	}
}

// TestWritesSourceInForce: auto follows the reader; binlog without it is
// the packet; estimate and packet never use it.
func TestWritesSourceInForce(t *testing.T) {
	bl := &fakeBinlog{}
	for _, tc := range []struct {
		src  WriteSource
		bl   Binlog
		attr binlog.Attribution
		want string
	}{
		{WriteAuto, bl, binlog.AttributeGTID, "binlog"},
		{WriteAuto, bl, binlog.AttributeNone, "estimate"},
		{WriteAuto, nil, 0, "estimate"},
		{WriteBinlog, bl, binlog.AttributeThread, "binlog"},
		{WriteBinlog, bl, binlog.AttributeNone, "packet"},
		{WriteEstimate, bl, binlog.AttributeGTID, "estimate"},
		{WritePacket, bl, binlog.AttributeGTID, "packet"},
	} {
		bl.attr = tc.attr
		reg := prometheus.NewRegistry()
		p := newWritesPolicy(t, testGroups(), tc.src, tc.bl, clock.NewFake(), reg)
		if got := p.WriteSourceInForce(); got != tc.want {
			t.Errorf("%s with %v: %s, want %s", tc.src, tc.attr, got, tc.want)
		}
		if n, err := testutil.GatherAndCount(reg, "rgproxy_write_source"); err != nil || n != 3 {
			t.Errorf("rgproxy_write_source: %d series, %v", n, err)
		}
	}
	for _, s := range []string{"auto", "binlog", "estimate", "packet", "BINLOG"} {
		if _, err := ParseWriteSource(s); err != nil {
			t.Errorf("ParseWriteSource(%q): %v", s, err)
		}
	}
	if _, err := ParseWriteSource("rows"); err == nil {
		t.Error("ParseWriteSource(rows) accepted")
	}
}

// TestWritesEstimate: without a binary log, a statement naming one table
// pays max(packet, affected rows × the table's AVG_ROW_LENGTH), the
// average read once per table and minute on the session's connection,
// before the statement runs.
func TestWritesEstimate(t *testing.T) {
	tok := testGroups()
	clk := clock.NewFake()
	p := newWritesPolicy(t, tok, WriteEstimate, nil, clk, nil)
	s := p.Open(mysqlproto.SessionInfo{User: "root"})
	// t: 1,183,744 bytes a row (1 MiB blobs in 16 KiB pages); o.u: 100.
	be := &sessionBackend{db: "db", avg: map[string]string{"74": "1183744", "75": "100"}}
	const avgT = 1183744.0
	base := 2.0
	packet := func(q string) float64 { return float64(len(q)+1) / 1024 }
	tests := []struct {
		x       stmt
		wantWRU float64
		source  string
		lookups int // queries so far
	}{
		{stmt{q: "INSERT INTO t (b) VALUES (@v)", affected: 1}, base + avgT/1024, "estimate", 1},
		{stmt{q: "insert low_priority ignore into `t` (b) select @v from seq_1_to_2", affected: 2}, base + 2*avgT/1024, "estimate", 1},
		{stmt{q: "EXECUTE IMMEDIATE 'INSERT INTO t (b) VALUES (?)' USING @v", affected: 1}, avgT / 1024, "estimate", 1},
		{stmt{q: "PREPARE s FROM 'REPLACE INTO o.u (b) VALUES (?)'"}, 0, "packet", 1},
		{stmt{q: "EXECUTE s USING @v", affected: 3}, 300.0 / 1024, "estimate", 2},
		{stmt{q: "UPDATE t AS a SET b = @v WHERE id = 1", affected: 1}, base + avgT/1024, "estimate", 2},
		// The packet is larger than the estimate: it stands.
		{stmt{q: "INSERT INTO o.u (b) VALUES (@v)", affected: 1, payload: 4096}, base + 4, "estimate", 2},
		// Nothing to estimate: deletes (they write no row), joins,
		// CALL, failures.
		{stmt{q: "DELETE FROM t WHERE id = 1", affected: 1}, base + packet("DELETE FROM t WHERE id = 1"), "packet", 2},
		{stmt{q: "UPDATE t JOIN u SET t.b = u.b", affected: 1}, base + packet("UPDATE t JOIN u SET t.b = u.b"), "packet", 2},
		{stmt{q: "CALL p()", affected: 1}, base + packet("CALL p()"), "packet", 2},
		{stmt{q: "INSERT INTO t (b) VALUES (@v)", errCode: 1062}, base, "packet", 2},
	}
	for _, tc := range tests {
		runStmt(t, s, be, tc.x)
		row := showLast(t, s)
		if got := wruOf(t, row); math.Abs(got-tc.wantWRU) > 0.001 || row["WRU_SOURCE"] != tc.source {
			t.Errorf("%s: WRU %v (%s), want %v (%s)", tc.x.q, got, row["WRU_SOURCE"], tc.wantWRU, tc.source)
		}
		if be.tableLookups() != tc.lookups {
			t.Errorf("%s: %d lookups %q, want %d", tc.x.q, be.tableLookups(), be.queries, tc.lookups)
		}
	}
	// Qualified names go hex-encoded; the unqualified ones use DATABASE().
	var lookups []string
	for _, q := range be.queries {
		if strings.HasPrefix(q, "SELECT DATABASE()") {
			lookups = append(lookups, q)
		}
	}
	if q := lookups[1]; !strings.Contains(q, "TABLE_SCHEMA = X'6f'") || !strings.Contains(q, "TABLE_NAME = X'75'") {
		t.Errorf("lookup of o.u: %s", q)
	}
	// A minute later the average is read again; USE forgets the database.
	clk.Advance(time.Minute)
	runStmt(t, s, be, stmt{q: "USE other"})
	runStmt(t, s, be, stmt{q: "INSERT INTO t (b) VALUES (@v)", affected: 1})
	if be.tableLookups() != 3 {
		t.Errorf("after a minute: %q", be.queries)
	}
}

// TestWritesGiveBackRowCount: the @@last_gtid query after a DML statement
// sets ROW_COUNT() to -1; the next statement gets the DML's count back.
func TestWritesGiveBackRowCount(t *testing.T) {
	tok := testGroups()
	bl := &fakeBinlog{attr: binlog.AttributeGTID, txns: map[string]int64{}}
	p := newWritesPolicy(t, tok, WriteAuto, bl, clock.NewFake(), nil)
	s := p.Open(mysqlproto.SessionInfo{User: "root"})
	be := &sessionBackend{gtid: "0-1-1"}
	next := func(q string) string {
		t.Helper()
		st := query(q)
		v := s.Before(context.Background(), st, be)
		if v.Reply != nil {
			t.Fatalf("%s answered", q)
		}
		out := &mysqlproto.Outcome{}
		s.After(st, out)
		s.(mysqlproto.FollowUpper).FollowUp(context.Background(), st, out, be)
		return v.Rewrite
	}
	runStmt(t, s, be, stmt{q: "DELETE FROM t WHERE id < 4", affected: 3})
	if got := next("SELECT ROW_COUNT()"); got != "SELECT CAST(3 AS SIGNED) AS `ROW_COUNT()`" {
		t.Errorf("after DELETE: %q", got)
	}
	// Only the statement right after: the SELECT itself was not asked about.
	if got := next("SELECT ROW_COUNT()"); got != "" {
		t.Errorf("two statements after: %q", got)
	}
	be.gtid = "0-1-2"
	runStmt(t, s, be, stmt{q: "UPDATE t SET a = 1", errCode: 1062})
	if got := next("select row_count() into @n"); got != "select CAST(-1 AS SIGNED) AS `row_count()` into @n" {
		t.Errorf("after a failed UPDATE: %q", got)
	}
	// A multi-statement after a DML statement: its first statement's
	// ROW_COUNT() is the DML's, a later one's is its own statement's.
	be.gtid = "0-1-4"
	runStmt(t, s, be, stmt{q: "DELETE FROM t WHERE id < 9", affected: 5})
	st := query("SELECT ROW_COUNT(); DELETE FROM t; SELECT ROW_COUNT()")
	st.Multi = true
	v := s.Before(context.Background(), st, be)
	if want := "SELECT CAST(5 AS SIGNED) AS `ROW_COUNT()`; DELETE FROM t; SELECT ROW_COUNT()"; v.Rewrite != want {
		t.Errorf("multi-statement: %q, want %q", v.Rewrite, want)
	}
	s.After(st, &mysqlproto.Outcome{})
	// Not asked about (a CALL's count is not known): nothing to give back.
	be.gtid = "0-1-3"
	runStmt(t, s, be, stmt{q: "CALL p()", affected: 1})
	if got := next("SELECT ROW_COUNT()"); got != "" {
		t.Errorf("after CALL: %q", got)
	}
}
