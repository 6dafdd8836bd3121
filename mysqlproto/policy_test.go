package mysqlproto

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	sqldriver "github.com/go-sql-driver/mysql"
	"github.com/rgproxy/rgproxy/sqlscan"
)

type recStmt struct {
	st  Statement
	out Outcome
}

// recPolicy records what a Server tells its policy, and answers queries
// that start with "rgp:" locally.
type recPolicy struct {
	mu     sync.Mutex
	opens  []SessionInfo
	events []EventKind
	infos  []SessionInfo
	stmts  []recStmt
	closed chan SessionInfo
}

func newRecPolicy() *recPolicy { return &recPolicy{closed: make(chan SessionInfo, 16)} }

func (p *recPolicy) Open(info SessionInfo) SessionPolicy {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.opens = append(p.opens, info)
	return &recSession{p: p}
}

func (p *recPolicy) outcomes() []recStmt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]recStmt(nil), p.stmts...)
}

// waitOutcome returns the last outcome recorded for query q, waiting up
// to five seconds for it: After runs once the reply is on its way.
func (p *recPolicy) waitOutcome(t *testing.T, q string) recStmt {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stmts := p.outcomes()
		for i := len(stmts) - 1; i >= 0; i-- {
			if stmts[i].st.Query == q {
				return stmts[i]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no outcome for %q in %d outcomes", q, len(stmts))
		}
		time.Sleep(time.Millisecond)
	}
}

type recSession struct{ p *recPolicy }

func str(s string) *string { return &s }

func (s *recSession) Before(ctx context.Context, st *Statement, be Backend) Verdict {
	switch st.Query {
	case "rgp:ok":
		return Verdict{Reply: &Reply{AffectedRows: 3, Info: "done"}}
	case "rgp:err":
		return Verdict{Reply: &Reply{Err: &Error{Code: 8252, State: "HY000", Message: "Exceeded resource group quota limitation"}}}
	case "rgp:rows":
		return Verdict{Reply: &Reply{Columns: []string{"a", "b"}, Rows: [][]*string{{str("1"), nil}, {str("x"), str("y")}}}}
	case "rgp:backend":
		cols, rows, err := be.Query(ctx, "SELECT CURRENT_USER() AS u, NULL AS n, 42 AS v")
		if err != nil {
			return Verdict{Reply: &Reply{Err: &Error{Code: 1105, Message: err.Error()}}}
		}
		return Verdict{Reply: &Reply{Columns: cols, Rows: rows}}
	case "rgp:backend-error":
		_, _, err := be.Query(ctx, "SELECT * FROM no_such_table")
		var e *Error
		if !errors.As(err, &e) {
			return Verdict{Reply: &Reply{Err: &Error{Code: 1105, Message: "want *Error"}}}
		}
		return Verdict{Reply: &Reply{Err: e}}
	case "rgp:panic":
		panic("policy exploded")
	}
	if strings.HasPrefix(st.Query, "rgp:big") {
		return Verdict{Reply: &Reply{AffectedRows: 1}}
	}
	return Verdict{}
}

func (s *recSession) After(st *Statement, out *Outcome) {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	s.p.stmts = append(s.p.stmts, recStmt{*st, *out})
}

func (s *recSession) Event(kind EventKind, info SessionInfo) {
	s.p.mu.Lock()
	s.p.events = append(s.p.events, kind)
	s.p.infos = append(s.p.infos, info)
	s.p.mu.Unlock()
	if kind == EventClose {
		s.p.closed <- info
	}
}

func oneConn(t *testing.T, addr string) *sql.Conn {
	t.Helper()
	db := openDB(t, addr)
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestPolicyOutcomes(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	ctx := context.Background()
	c := oneConn(t, addr)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := c.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("DROP TABLE IF EXISTS pol; CREATE TABLE pol (id INT PRIMARY KEY, v VARCHAR(100))")
	var backendID uint32
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&backendID); err != nil {
		t.Fatal(err)
	}
	exec("BEGIN")
	exec("INSERT INTO pol VALUES (1, 'a'), (2, 'b')")
	exec("COMMIT")
	_, err := c.ExecContext(ctx, "SELECT * FROM no_such_table")
	var me *sqldriver.MySQLError
	if !errors.As(err, &me) || me.Number != 1146 {
		t.Fatalf("got %v", err)
	}
	exec("UPDATE pol SET v = ? WHERE id > ?", strings.Repeat("z", 50), 0)
	var v string
	if err := c.QueryRowContext(ctx, "SELECT v FROM pol WHERE id = 1").Scan(&v); err != nil {
		t.Fatal(err)
	}

	pol.mu.Lock()
	if len(pol.opens) != 1 || pol.opens[0].User != "root" || pol.opens[0].BackendConnID != backendID {
		t.Errorf("Open got %+v, backend connection %d", pol.opens, backendID)
	}
	pol.mu.Unlock()
	// After runs in order, once the reply is on its way: when the last
	// statement's outcome is in, so are the others'.
	pol.waitOutcome(t, "SELECT v FROM pol WHERE id = 1")
	byQuery := map[string]recStmt{}
	for _, r := range pol.outcomes() {
		byQuery[r.st.Query] = r
	}
	tests := []struct {
		query    string
		class    sqlscan.Class
		inTxBef  bool
		inTxAft  bool
		affected uint64
		errCode  uint16
	}{
		{"SELECT CONNECTION_ID()", sqlscan.ClassRead, false, false, 0, 0},
		{"BEGIN", sqlscan.ClassOther, false, true, 0, 0},
		{"INSERT INTO pol VALUES (1, 'a'), (2, 'b')", sqlscan.ClassWrite, true, true, 2, 0},
		{"COMMIT", sqlscan.ClassWrite, true, false, 0, 0},
		{"SELECT * FROM no_such_table", sqlscan.ClassRead, false, false, 0, 1146},
		{"DROP TABLE IF EXISTS pol; CREATE TABLE pol (id INT PRIMARY KEY, v VARCHAR(100))", sqlscan.ClassWrite, false, false, 0, 0},
	}
	for _, tt := range tests {
		r, ok := byQuery[tt.query]
		if !ok {
			t.Errorf("%q: no outcome", tt.query)
			continue
		}
		if r.st.Class != tt.class || r.st.InTransaction != tt.inTxBef || r.out.InTransaction != tt.inTxAft ||
			r.out.AffectedRows != tt.affected || r.out.ErrCode != tt.errCode || r.st.Command != mysql.COM_QUERY {
			t.Errorf("%q: statement %+v outcome %+v", tt.query, r.st, r.out)
		}
		if want := int64(len(tt.query) + 1); r.st.PayloadBytes != want || r.out.RequestBytes != want {
			t.Errorf("%q: payload %d request %d, want %d", tt.query, r.st.PayloadBytes, r.out.RequestBytes, want)
		}
		if r.out.ResponseBytes <= 0 || r.out.BackendTime <= 0 {
			t.Errorf("%q: response bytes %d, backend time %v", tt.query, r.out.ResponseBytes, r.out.BackendTime)
		}
	}
	if r := byQuery["DROP TABLE IF EXISTS pol; CREATE TABLE pol (id INT PRIMARY KEY, v VARCHAR(100))"]; !r.st.Multi {
		t.Error("multi-statement not flagged Multi")
	}
	// The prepared UPDATE: PREPARE is "other", EXECUTE inherits the text's class.
	var sawPrep, sawExec bool
	for _, r := range pol.outcomes() {
		if !strings.HasPrefix(r.st.Query, "UPDATE pol") {
			continue
		}
		switch r.st.Command {
		case mysql.COM_STMT_PREPARE:
			sawPrep = r.st.Class == sqlscan.ClassOther
		case mysql.COM_STMT_EXECUTE:
			sawExec = r.st.Class == sqlscan.ClassWrite && r.out.AffectedRows == 2 && r.out.RequestBytes > 50
		}
	}
	if !sawPrep || !sawExec {
		t.Errorf("prepared statement outcomes wrong: prepare %v execute %v in %+v", sawPrep, sawExec, pol.outcomes())
	}
	// The SELECT's response carries one row of 50 bytes and its metadata.
	if r := byQuery["SELECT v FROM pol WHERE id = 1"]; r.out.ResponseBytes < 50+20 {
		t.Errorf("SELECT response bytes %d", r.out.ResponseBytes)
	}
}

func TestPolicyReplies(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	ctx := context.Background()
	c := oneConn(t, addr)
	r, err := c.ExecContext(ctx, "rgp:ok")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := r.RowsAffected(); n != 3 {
		t.Errorf("affected %d", n)
	}
	_, err = c.ExecContext(ctx, "rgp:err")
	var me *sqldriver.MySQLError
	if !errors.As(err, &me) || me.Number != 8252 || string(me.SQLState[:]) != "HY000" {
		t.Errorf("got %v", err)
	}
	rows, err := c.QueryContext(ctx, "rgp:rows")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var a, b sql.NullString
		if err := rows.Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		got = append(got, a.String+"/"+b.String+"/"+map[bool]string{true: "v", false: "null"}[b.Valid])
	}
	rows.Close()
	if strings.Join(got, ",") != "1//null,x/y/v" {
		t.Errorf("rows %q", got)
	}
	var u string
	var n sql.NullString
	var v int
	if err := c.QueryRowContext(ctx, "rgp:backend").Scan(&u, &n, &v); err != nil || u != "root@localhost" && u != "root@127.0.0.1" && u != "root@%" || n.Valid || v != 42 {
		t.Errorf("backend query: %q %v %d %v", u, n, v, err)
	}
	_, err = c.ExecContext(ctx, "rgp:backend-error")
	if !errors.As(err, &me) || me.Number != 1146 {
		t.Errorf("backend error: %v", err)
	}
	// The session still works, and local replies were never forwarded.
	var one int
	if err := c.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatal(err)
	}
	for _, r := range pol.outcomes() {
		if strings.HasPrefix(r.st.Query, "rgp:") {
			t.Errorf("local reply reached After: %+v", r)
		}
	}
}

func TestPolicyPanicRecovered(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	ctx := context.Background()
	good := oneConn(t, addr)
	bad := oneConn(t, addr)
	if _, err := bad.ExecContext(ctx, "rgp:panic"); err == nil {
		t.Fatal("panicking policy: no error")
	}
	select {
	case <-pol.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("no close event after the panic")
	}
	var one int
	if err := good.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("other session: %v", err)
	}
}

func TestSessionEvents(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	rc := dialRaw(t, addr, "root", "")
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_RESET_CONNECTION}); m.ErrCode != 0 {
		t.Fatalf("reset: %d", m.ErrCode)
	}
	// COM_CHANGE_USER to another account, answered with the greeting's salt.
	cu := append([]byte{mysql.COM_CHANGE_USER}, "rgp_user\x00"...)
	auth := nativePassword(rc.salt, "secret1")
	cu = append(append(cu, byte(len(auth))), auth...)
	cu = append(cu, "rgproxy_test\x00"...)
	cu = append(cu, 45, 0)
	cu = append(cu, "mysql_native_password\x00"...)
	rc.write(0, cu)
	rc.finishAuth("secret1")
	raw, _ := rc.cmd(respGeneric, false, query("SELECT CURRENT_USER()"))
	if !strings.Contains(string(raw), "rgp_user@%") {
		t.Fatalf("after change user: %q", raw)
	}
	rc.write(0, []byte{mysql.COM_QUIT})
	rc.expectClosed()
	var info SessionInfo
	select {
	case info = <-pol.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("no close event")
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	want := []EventKind{EventResetConnection, EventChangeUser, EventClose}
	if len(pol.events) != len(want) {
		t.Fatalf("events %v, want %v", pol.events, want)
	}
	for i := range want {
		if pol.events[i] != want[i] {
			t.Fatalf("events %v, want %v", pol.events, want)
		}
	}
	if pol.infos[1].User != "rgp_user" || info.User != "rgp_user" || pol.opens[0].User != "root" {
		t.Errorf("users: open %q, change %q, close %q", pol.opens[0].User, pol.infos[1].User, info.User)
	}
}

// Request bytes that stream after the first packet are counted: LOCAL
// INFILE data, SEND_LONG_DATA, multi-packet payloads.
func TestPolicyStreamedRequestBytes(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	ctx := context.Background()
	c := oneConn(t, addr)
	if _, err := c.ExecContext(ctx, "DROP TABLE IF EXISTS sb; CREATE TABLE sb (a INT, b LONGTEXT)"); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "in.csv")
	data := strings.Repeat("7,some text\n", 5000)
	if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	load := "LOAD DATA LOCAL INFILE '" + f + "' INTO TABLE sb FIELDS TERMINATED BY ','"
	if _, err := c.ExecContext(ctx, load); err != nil {
		t.Fatal(err)
	}

	rc := dialRaw(t, addr, "root", "")
	_, m := rc.cmd(respPrepare, false, append([]byte{mysql.COM_STMT_PREPARE}, "INSERT INTO sb VALUES (1, ?)"...))
	id := m.StmtID
	chunk := append([]byte{mysql.COM_STMT_SEND_LONG_DATA, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), 0, 0}, strings.Repeat("L", 1000)...)
	rc.write(0, chunk)
	rc.write(0, chunk)
	exec := []byte{mysql.COM_STMT_EXECUTE, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), 0, 1, 0, 0, 0, 0, 1, 0xfc, 0}
	if _, m := rc.cmd(respGeneric, true, exec); m.ErrCode != 0 {
		t.Fatalf("execute: %d", m.ErrCode)
	}
	big := "SELECT LENGTH('" + strings.Repeat("q", 17<<20) + "')"
	if raw, m := rc.cmd(respGeneric, false, query(big)); m.ErrCode != 0 || !strings.Contains(string(raw), "17825792") {
		t.Fatalf("big query: %d %q", m.ErrCode, raw[len(raw)-20:])
	}
	// After runs in order, once the reply is on its way: when this one's
	// outcome is in, so are the big query's.
	rc.cmd(respGeneric, false, query("SELECT 'sync'"))
	pol.waitOutcome(t, "SELECT 'sync'")

	var sawLoad, sawExec, sawBig bool
	for _, r := range pol.outcomes() {
		switch {
		case r.st.Query == load:
			sawLoad = true
			if want := int64(len(load) + 1 + len(data)); r.out.RequestBytes != want || r.out.AffectedRows != 5000 || r.st.Class != sqlscan.ClassWrite {
				t.Errorf("LOAD DATA: request bytes %d (want %d), affected %d, class %v", r.out.RequestBytes, want, r.out.AffectedRows, r.st.Class)
			}
		case r.st.Command == mysql.COM_STMT_EXECUTE:
			sawExec = true
			if want := int64(len(exec) + 2*len(chunk)); r.out.RequestBytes != want || r.st.Query != "INSERT INTO sb VALUES (1, ?)" {
				t.Errorf("EXECUTE: request bytes %d, want %d; query %q", r.out.RequestBytes, want, r.st.Query)
			}
		case strings.HasPrefix(big, r.st.Query) && len(r.st.Query) == mysql.MaxPayloadLen-1: // the first packet's text
			sawBig = true
			if r.st.PayloadBytes != int64(mysql.MaxPayloadLen) || r.out.RequestBytes != int64(len(big)+1) || r.st.Class != sqlscan.ClassRead {
				t.Errorf("big query: payload %d request %d class %v", r.st.PayloadBytes, r.out.RequestBytes, r.st.Class)
			}
		}
	}
	if !sawLoad || !sawExec || !sawBig {
		t.Errorf("missing outcomes: load %v exec %v big %v", sawLoad, sawExec, sawBig)
	}
}

// A multi-packet command answered locally is skipped whole, and the reply
// carries the next sequence id.
func TestLocalReplyToMultiPacketCommand(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{Policy: newRecPolicy()})
	rc := dialRaw(t, addr, "root", "")
	rc.write(0, query("rgp:big"+strings.Repeat("x", mysql.MaxPayloadLen)))
	p, seq := rc.read()
	if p[0] != mysql.OK_HEADER || seq != 2 {
		t.Fatalf("reply %q seq %d", p, seq)
	}
	rc.write(0, append([]byte{0x12}, strings.Repeat("y", mysql.MaxPayloadLen+10)...)) // COM_BINLOG_DUMP
	p, seq = rc.read()
	if e := parseErrPacket(p); e.Code != mysql.ER_UNKNOWN_COM_ERROR || seq != 2 {
		t.Fatalf("unknown command: %v seq %d", e, seq)
	}
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("session unusable")
	}
}

// hookSession is a pass-through session that implements the optional
// hooks: it rewrites one error code and records progress calls.
type hookSession struct {
	passThroughSession
	mu       sync.Mutex
	progress []int64
}

func (h *hookSession) RewriteError(st *Statement, code uint16) *Error {
	if code == 1146 && strings.Contains(st.Query, "no_such_hook_table") {
		return &Error{Code: 8253, State: "HY000", Message: "rewritten by the policy"}
	}
	return nil
}

func (h *hookSession) Progress(_ *Statement, n int64) {
	h.mu.Lock()
	h.progress = append(h.progress, n)
	h.mu.Unlock()
}

type hookPolicy struct{ s *hookSession }

func (p hookPolicy) Open(SessionInfo) SessionPolicy { return p.s }

func TestPolicyHooks(t *testing.T) {
	h := &hookSession{}
	_, addr := startProxy(t, Config{Policy: hookPolicy{h}})
	c := oneConn(t, addr)
	ctx := context.Background()
	// The backend's 1146 reaches the client as the policy's error...
	_, err := c.ExecContext(ctx, "SELECT * FROM no_such_hook_table")
	var me *sqldriver.MySQLError
	if !errors.As(err, &me) || me.Number != 8253 || me.Message != "rewritten by the policy" {
		t.Fatalf("rewritten error: %v", err)
	}
	// ...other errors pass unchanged, and the session goes on.
	_, err = c.ExecContext(ctx, "SELECT * FROM no_such_other_table")
	if !errors.As(err, &me) || me.Number != 1146 {
		t.Fatalf("error not to rewrite: %v", err)
	}
	// A 1 MiB result (1,024 rows of 1 KiB) reports its progress every
	// 64 KiB, growing.
	rows, err := c.QueryContext(ctx, "SELECT REPEAT('x', 1024) FROM seq_1_to_1024")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if n != 1024 {
		t.Fatalf("read %d rows", n)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.progress) < 15 {
		t.Fatalf("%d progress calls for 1 MiB, want about 16: %v", len(h.progress), h.progress)
	}
	for i := 1; i < len(h.progress); i++ {
		if h.progress[i]-h.progress[i-1] < progressEvery {
			t.Fatalf("progress calls closer than 64 KiB: %v", h.progress)
		}
	}
}
