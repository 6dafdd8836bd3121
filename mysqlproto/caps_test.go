package mysqlproto

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// The capabilities rgproxy passes are listed by name: adding one (a new
// backend's bit, say) is a decision made here, with its test.
func TestSupportedCapabilities(t *testing.T) {
	passed := []uint32{mysql.CLIENT_LONG_PASSWORD, mysql.CLIENT_FOUND_ROWS, mysql.CLIENT_LONG_FLAG,
		mysql.CLIENT_CONNECT_WITH_DB, mysql.CLIENT_NO_SCHEMA, mysql.CLIENT_ODBC, mysql.CLIENT_LOCAL_FILES,
		mysql.CLIENT_IGNORE_SPACE, mysql.CLIENT_PROTOCOL_41, mysql.CLIENT_INTERACTIVE, mysql.CLIENT_IGNORE_SIGPIPE,
		mysql.CLIENT_TRANSACTIONS, mysql.CLIENT_RESERVED, mysql.CLIENT_SECURE_CONNECTION,
		mysql.CLIENT_MULTI_STATEMENTS, mysql.CLIENT_MULTI_RESULTS, mysql.CLIENT_PS_MULTI_RESULTS,
		mysql.CLIENT_PLUGIN_AUTH, mysql.CLIENT_CONNECT_ATTRS, mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
		mysql.CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS, mysql.CLIENT_SESSION_TRACK, mysql.CLIENT_DEPRECATE_EOF,
		mysql.CLIENT_QUERY_ATTRIBUTES}
	masked := []uint32{mysql.CLIENT_COMPRESS, mysql.CLIENT_SSL, mysql.CLIENT_OPTIONAL_RESULTSET_METADATA,
		mysql.CLIENT_ZSTD_COMPRESSION_ALGORITHM, mysql.MULTI_FACTOR_AUTHENTICATION, mysql.CLIENT_CAPABILITY_EXTENSION,
		mysql.CLIENT_SSL_VERIFY_SERVER_CERT, mysql.CLIENT_REMEMBER_OPTIONS}
	var all uint32
	for _, b := range passed {
		all |= b
	}
	if supportedCaps != all {
		t.Errorf("supportedCaps %#x, the list says %#x", supportedCaps, all)
	}
	for _, b := range masked {
		if supportedCaps&b != 0 {
			t.Errorf("capability %#x passed", b)
		}
	}
	if want := mariaProgress | mariaStmtBulk | mariaExtendedTypeInfo | mariaCacheMetadata; supportedMariaCaps != want {
		t.Errorf("supportedMariaCaps %#x, want %#x", supportedMariaCaps, want)
	}
	if supportedMariaCaps&(mariaComMulti|mariaBulkUnitResults) != 0 {
		t.Error("COM_MULTI or BULK_UNIT_RESULTS passed")
	}
}

// TestExactGreeting reads the greeting rgproxy relays from MariaDB 10.11:
// exactly these capabilities, so that a new bit, from rgproxy or from
// the backend, shows up here first.
func TestExactGreeting(t *testing.T) {
	needBackend(t)
	_, addr := startProxy(t, Config{})
	greet := func(addr string) greeting {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		p, _, err := readMessage(bufio.NewReader(c), nil, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		g, err := parseGreeting(p)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	direct, proxied := greet(backendAddr), greet(addr)
	if !strings.Contains(direct.ServerVersion, "10.11.") {
		t.Skipf("the expected capabilities are MariaDB 10.11's; the backend is %s", direct.ServerVersion)
	}
	const want = mysql.CLIENT_FOUND_ROWS | mysql.CLIENT_LONG_FLAG | mysql.CLIENT_CONNECT_WITH_DB |
		mysql.CLIENT_NO_SCHEMA | mysql.CLIENT_ODBC | mysql.CLIENT_LOCAL_FILES | mysql.CLIENT_IGNORE_SPACE |
		mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_INTERACTIVE | mysql.CLIENT_IGNORE_SIGPIPE |
		mysql.CLIENT_TRANSACTIONS | mysql.CLIENT_RESERVED | mysql.CLIENT_SECURE_CONNECTION |
		mysql.CLIENT_MULTI_STATEMENTS | mysql.CLIENT_MULTI_RESULTS | mysql.CLIENT_PS_MULTI_RESULTS |
		mysql.CLIENT_PLUGIN_AUTH | mysql.CLIENT_CONNECT_ATTRS | mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA |
		mysql.CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS | mysql.CLIENT_SESSION_TRACK | mysql.CLIENT_DEPRECATE_EOF
	const wantMaria = mariaProgress | mariaStmtBulk | mariaExtendedTypeInfo | mariaCacheMetadata
	if proxied.Caps != want || proxied.MariaCaps != wantMaria {
		t.Errorf("greeting capabilities %#x, extended %#x; want %#x, %#x", proxied.Caps, proxied.MariaCaps, want, wantMaria)
	}
	// What the backend offers and rgproxy does not pass: compression, bit
	// 31 and SSL if the backend has it (no client TLS is configured here).
	wantMasked := mysql.CLIENT_COMPRESS | mysql.CLIENT_REMEMBER_OPTIONS | direct.Caps&mysql.CLIENT_SSL
	if got := direct.Caps &^ proxied.Caps; got != wantMasked {
		t.Errorf("masked %#x, want %#x", got, wantMasked)
	}
	if direct.MariaCaps != wantMaria {
		t.Errorf("MariaDB 10.11 offers extended capabilities %#x, want %#x", direct.MariaCaps, wantMaria)
	}
}

func TestQueryAttributesLen(t *testing.T) {
	text := []byte("SELECT 1")
	tests := []struct {
		name  string
		block []byte
		err   bool
	}{
		{"none", []byte{0, 1}, false},
		{"one string", attrBlock(attr{"trace", mysql.MYSQL_TYPE_VAR_STRING, lenencStr("abc")}), false},
		{"int, null, double, date, decimal", attrBlock(
			attr{"i", mysql.MYSQL_TYPE_LONG, []byte{1, 2, 3, 4}},
			attr{"n", mysql.MYSQL_TYPE_NULL, nil},
			attr{"d", mysql.MYSQL_TYPE_DOUBLE, make([]byte, 8)},
			attr{"t", mysql.MYSQL_TYPE_DATETIME, []byte{4, 0xe8, 7, 1, 2}},
			attr{"x", mysql.MYSQL_TYPE_NEWDECIMAL, lenencStr("1.50")},
		), false},
		{"nine, one NULL by bitmap", attrBlock(
			attr{"a", mysql.MYSQL_TYPE_TINY, []byte{1}}, attr{"b", mysql.MYSQL_TYPE_SHORT, []byte{1, 0}},
			attr{"c", mysql.MYSQL_TYPE_LONGLONG, make([]byte, 8)}, attr{"d", mysql.MYSQL_TYPE_FLOAT, make([]byte, 4)},
			attr{"e", mysql.MYSQL_TYPE_TIME, []byte{0}}, attr{"f", mysql.MYSQL_TYPE_BLOB, lenencStr("zz")},
			attr{"g", mysql.MYSQL_TYPE_YEAR, []byte{0xe8, 7}}, attr{"h", mysql.MYSQL_TYPE_JSON, lenencStr("{}")},
			attr{"i", mysql.MYSQL_TYPE_STRING, nil}), false},
		{"empty", nil, true},
		{"no set count", []byte{0}, true},
		{"no bind flag", []byte{1, 1, 0}, true},
		{"bind flag 0", []byte{1, 1, 0, 0}, true},
		{"huge count", []byte{0xfc, 0xff, 0xff, 1}, true},
		{"truncated name", []byte{1, 1, 0, 1, mysql.MYSQL_TYPE_LONG, 0, 5, 'a'}, true},
		{"truncated value", []byte{1, 1, 0, 1, mysql.MYSQL_TYPE_LONG, 0, 1, 'a', 1, 2}, true},
		{"unknown type", []byte{1, 1, 0, 1, 0x80, 0, 1, 'a', 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err {
				k, err := queryAttributesLen(tt.block)
				if err == nil || !errors.Is(err, errQueryAttributes) {
					t.Fatalf("got %d, %v; want an error", k, err)
				}
				return
			}
			k, err := queryAttributesLen(append(bytes.Clone(tt.block), text...))
			if err != nil || k != len(tt.block) {
				t.Fatalf("got %d, %v; want %d", k, err, len(tt.block))
			}
		})
	}
}

func FuzzQueryAttributesLen(f *testing.F) {
	f.Add([]byte{0, 1, 'S'})
	f.Add(attrBlock(attr{"trace", mysql.MYSQL_TYPE_VAR_STRING, lenencStr("abc")}, attr{"n", mysql.MYSQL_TYPE_LONG, nil}))
	f.Add([]byte{2, 1, 0, 1, 7, 0, 0, 12, 0, 0, 11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := queryAttributesLen(b)
		if err == nil && (k < 2 || k > len(b)) {
			t.Fatalf("length %d of %d bytes", k, len(b))
		}
	})
}

// attr is one query attribute; a nil value is NULL.
type attr struct {
	name  string
	typ   byte
	value []byte
}

// attrBlock renders a query-attribute block as MySQL 8's client does.
func attrBlock(attrs ...attr) []byte {
	b := appendLenenc(nil, uint64(len(attrs)))
	b = append(b, 1)
	if len(attrs) == 0 {
		return b
	}
	nulls := make([]byte, (len(attrs)+7)/8)
	for i, a := range attrs {
		if a.value == nil {
			nulls[i/8] |= 1 << (i % 8)
		}
	}
	b = append(append(b, nulls...), 1)
	for _, a := range attrs {
		b = appendLenencString(append(b, a.typ, 0), a.name)
	}
	for _, a := range attrs {
		b = append(b, a.value...)
	}
	return b
}

func lenencStr(s string) []byte { return appendLenencString(nil, s) }

// scriptedBackend serves each connection (one at a time) with greeting,
// takes the login with an OK, then hands each command to answer until
// COM_QUIT.
func scriptedBackend(tb testing.TB, greeting []byte, answer func(cmd []byte, r *backendReply)) string {
	tb.Helper()
	ln := serveTCP(tb, func(c net.Conn) {
		defer c.Close()
		br, bw := bufio.NewReader(c), bufio.NewWriter(c)
		_, _ = writeMessage(bw, 0, greeting)
		_ = bw.Flush()
		if _, seq, err := readMessage(br, nil, 1<<20); err == nil {
			_, _ = writeMessage(bw, seq+1, okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
			_ = bw.Flush()
		}
		var cmd []byte
		var err error
		r := &backendReply{bw: bw}
		for {
			if cmd, _, err = readMessage(br, cmd, 1<<24); err != nil || len(cmd) == 0 || cmd[0] == mysql.COM_QUIT {
				return
			}
			r.seq = 1
			answer(cmd, r)
		}
	})
	return ln.Addr().String()
}

// backendReply writes a scripted backend's answer to one command.
type backendReply struct {
	bw  *bufio.Writer
	seq byte
}

// send writes payloads with the next sequence ids, and flushes.
func (r *backendReply) send(ps ...[]byte) {
	for _, p := range ps {
		_, _ = writeMessage(r.bw, r.seq, p)
		r.seq++
	}
	_ = r.bw.Flush()
}

// raw writes packets as they are, headers included, and flushes.
func (r *backendReply) raw(b []byte) {
	_, _ = r.bw.Write(b)
	_ = r.bw.Flush()
}

// attrPolicy records statements and their outcomes, rewrites the query
// "rgp:rewrite" and runs "rgp:backend" on the session's backend.
type attrPolicy struct {
	mu    sync.Mutex
	stmts []recStmt
}

func (p *attrPolicy) Open(SessionInfo) SessionPolicy { return p }
func (p *attrPolicy) Before(ctx context.Context, st *Statement, be Backend) Verdict {
	switch st.Query {
	case "rgp:rewrite":
		return Verdict{Rewrite: "SELECT 'rewritten'"}
	case "rgp:backend":
		cols, rows, err := be.Query(ctx, "SELECT 'policy'")
		if err != nil || len(cols) != 1 || len(rows) != 1 {
			return Verdict{Reply: &Reply{Err: &Error{Code: 1105, Message: fmt.Sprintf("policy query: %v %v %v", cols, rows, err)}}}
		}
		return Verdict{Reply: &Reply{Columns: cols, Rows: rows}}
	}
	return Verdict{}
}
func (p *attrPolicy) After(st *Statement, out *Outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stmts = append(p.stmts, recStmt{*st, *out})
}
func (p *attrPolicy) Event(EventKind, SessionInfo) {}

// TestQueryAttributesThroughProxy runs COM_QUERY with MySQL 8's query
// attributes against a scripted MySQL 8 backend: the policy sees only the
// SQL text, the backend gets the client's bytes, a rewritten statement
// keeps the client's attributes, and the policy's own queries carry an
// empty attribute block.
func TestQueryAttributesThroughProxy(t *testing.T) {
	caps := (supportedCaps | mysql.CLIENT_SSL) &^ mysql.CLIENT_DEPRECATE_EOF
	var mu sync.Mutex
	var got [][]byte
	backend := scriptedBackend(t, mariaGreeting(caps, 0, "mysql_native_password"), func(cmd []byte, r *backendReply) {
		send := r.send
		mu.Lock()
		got = append(got, bytes.Clone(cmd))
		mu.Unlock()
		if cmd[0] != mysql.COM_QUERY {
			send(okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
			return
		}
		k, err := queryAttributesLen(cmd[1:])
		if err != nil {
			send(errPkt(mysql.ER_MALFORMED_PACKET))
			return
		}
		text := string(cmd[1+k:])
		if strings.HasPrefix(text, "SELECT '") {
			v := strings.Trim(strings.TrimPrefix(text, "SELECT "), "'")
			send(countPkt(1), colPkt(v), eofPkt(0), rowPkt(v), eofPkt(mysql.SERVER_STATUS_AUTOCOMMIT))
			return
		}
		send(okPkt(1, mysql.SERVER_STATUS_AUTOCOMMIT))
	})
	pol := &attrPolicy{}
	_, addr := startProxy(t, Config{BackendAddr: backend, Policy: pol})
	rc := dialRawCaps(t, addr, "app", "", rawCaps|mysql.CLIENT_QUERY_ATTRIBUTES, 0)
	if rc.caps&mysql.CLIENT_QUERY_ATTRIBUTES == 0 {
		t.Fatal("QUERY_ATTRIBUTES not offered")
	}
	attrs := attrBlock(attr{"trace_id", mysql.MYSQL_TYPE_VAR_STRING, lenencStr("abc-123")}, attr{"shard", mysql.MYSQL_TYPE_LONG, []byte{7, 0, 0, 0}},
		attr{"none", mysql.MYSQL_TYPE_NULL, nil})
	withAttrs := func(text string) []byte { return append(append([]byte{mysql.COM_QUERY}, attrs...), text...) }
	sent := [][]byte{
		withAttrs("INSERT /* a write */ INTO t VALUES (1)"),
		append([]byte{mysql.COM_QUERY, 0, 1}, "SELECT 'plain'"...),
		withAttrs("rgp:rewrite"),
		withAttrs("rgp:backend"),
	}
	for i, p := range sent {
		if _, m := rc.cmd(respGeneric, false, p); m.ErrCode != 0 {
			t.Fatalf("command %d: error %d", i, m.ErrCode)
		}
	}
	// A block rgproxy cannot read is refused, and the session goes on.
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_QUERY, 1, 1, 0, 1, 0x80, 0, 1, 'a', 1, 'S'}); m.ErrCode != mysql.ER_MALFORMED_PACKET {
		t.Fatalf("malformed attributes: error %d", m.ErrCode)
	}
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("session lost after malformed attributes")
	}
	rc.write(0, []byte{mysql.COM_QUIT})
	want := [][]byte{
		sent[0], sent[1],
		withAttrs("SELECT 'rewritten'"),
		append([]byte{mysql.COM_QUERY, 0, 1}, "SELECT 'policy'"...),
		{mysql.COM_PING},
	}
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= len(want) })
	mu.Lock()
	defer mu.Unlock()
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("backend command %d: %q, want %q", i, got[i], want[i])
		}
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if len(pol.stmts) < 3 {
		t.Fatalf("%d statements reached After", len(pol.stmts))
	}
	first := pol.stmts[0]
	if first.st.Query != "INSERT /* a write */ INTO t VALUES (1)" || first.st.Class != sqlscan.ClassWrite ||
		first.st.PayloadBytes != int64(len(sent[0])) || first.out.RequestBytes != int64(len(sent[0])) {
		t.Errorf("first statement %+v, outcome %+v", first.st, first.out)
	}
	if pol.stmts[1].st.Query != "SELECT 'plain'" || pol.stmts[1].st.Class != sqlscan.ClassRead {
		t.Errorf("second statement %+v", pol.stmts[1].st)
	}
}

// TestProgressRelayed: MariaDB's progress reports reach the client in
// order with their sequence ids while the statement runs, and the
// statement's outcome is its final OK, not an error.
func TestProgressRelayed(t *testing.T) {
	caps := supportedCaps &^ mysql.CLIENT_LONG_PASSWORD
	report := progressPkt(1, 2, "copy to tmp table")
	release := make(chan struct{})
	backend := scriptedBackend(t, mariaGreeting(caps, 0x1f, "mysql_native_password"), func(cmd []byte, r *backendReply) {
		send := r.send
		if cmd[0] != mysql.COM_QUERY {
			send(okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
			return
		}
		send(report)
		<-release // the statement still runs: the report must be out already
		send(progressPkt(2, 2, "Enabling keys"), okPkt(7, mysql.SERVER_STATUS_AUTOCOMMIT))
	})
	pol := &attrPolicy{}
	_, addr := startProxy(t, Config{BackendAddr: backend, Policy: pol})
	rc := dialRawCaps(t, addr, "app", "", rawCaps, mariaProgress)
	if rc.maria != mariaProgress {
		t.Fatalf("PROGRESS not negotiated: %#x", rc.maria)
	}
	rc.write(0, query("ALTER TABLE t ADD COLUMN c INT"))
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	p, seq := rc.read()
	close(release)
	if !bytes.Equal(p, report) || seq != 1 {
		t.Fatalf("first packet %q seq %d, want the progress report", p, seq)
	}
	if p, seq = rc.read(); !isProgress(p) || seq != 2 {
		t.Fatalf("second packet %q seq %d", p, seq)
	}
	if p, seq = rc.read(); p[0] != mysql.OK_HEADER || seq != 3 {
		t.Fatalf("third packet %q seq %d", p, seq)
	}
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
		t.Fatal("ping after progress")
	}
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if out := pol.stmts[0].out; out.ErrCode != 0 || out.AffectedRows != 7 {
		t.Errorf("outcome %+v", out)
	}
}

// rawResp is one response read with the test's own framing.
type rawResp struct {
	packets  [][]byte // header (sequence id less the progress reports before it) and payload
	progress int
	status   uint16
}

// wireResp reads the response to cmd with framing written apart from
// respMachine (so that a mistake there cannot hide here), checking that
// sequence ids run on from 1. cursor says the command asked for a cursor.
func (rc *rawClient) wireResp(cmd byte, cursor bool) rawResp {
	rc.t.Helper()
	var r rawResp
	want := byte(1)
	deprecate := rc.caps&mysql.CLIENT_DEPRECATE_EOF != 0
	next := func() []byte {
		rc.t.Helper()
		for {
			p, seq := rc.read()
			if seq != want {
				rc.t.Fatalf("command 0x%02x: sequence id %d, want %d", cmd, seq, want)
			}
			want++
			if rc.maria&mariaProgress != 0 && len(p) >= 3 && p[0] == 0xff && p[1] == 0xff && p[2] == 0xff {
				r.progress++
				continue
			}
			n := len(p)
			r.packets = append(r.packets, append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq - byte(r.progress)}, p...))
			return p
		}
	}
	status := func(p []byte, ok bool) {
		if ok { // header, affected rows, insert id, status
			_, k1, _ := lenenc(p[1:])
			_, k2, _ := lenenc(p[1+k1:])
			p = p[1+k1+k2:]
			r.status = uint16(p[0]) | uint16(p[1])<<8
			return
		}
		r.status = uint16(p[3]) | uint16(p[4])<<8
	}
	isEnd := func(p []byte) bool { return p[0] == 0xfe && len(p) < 0xffffff }
	defs := func(n int) {
		for range n {
			next()
		}
		if n > 0 && !deprecate {
			status(next(), false)
		}
	}
	switch cmd {
	case mysql.COM_STMT_CLOSE, mysql.COM_STMT_SEND_LONG_DATA:
		return r
	case mysql.COM_STMT_PREPARE:
		p := next()
		if p[0] == mysql.OK_HEADER {
			defs(int(p[7]) | int(p[8])<<8)
			defs(int(p[5]) | int(p[6])<<8)
		}
		return r
	case mysql.COM_STMT_FETCH, mysql.COM_FIELD_LIST:
		for {
			p := next()
			if p[0] == mysql.ERR_HEADER {
				return r
			}
			if isEnd(p) {
				status(p, deprecate && len(p) >= 7)
				return r
			}
		}
	}
	for {
		p := next()
		switch p[0] {
		case mysql.ERR_HEADER:
			return r
		case mysql.OK_HEADER:
			status(p, true)
			if r.status&mysql.SERVER_MORE_RESULTS_EXISTS == 0 {
				return r
			}
			continue
		}
		cnt, k, _ := lenenc(p)
		follows := rc.maria&mariaCacheMetadata == 0 || p[k] == 1
		r.status = 0
		if follows {
			defs(int(cnt))
		} else if !deprecate {
			status(next(), false)
		}
		if !deprecate && cursor && r.status&mysql.SERVER_STATUS_CURSOR_EXISTS != 0 && r.status&mysql.SERVER_MORE_RESULTS_EXISTS == 0 {
			return r
		}
		for {
			p = next()
			if p[0] == mysql.ERR_HEADER {
				return r
			}
			if isEnd(p) {
				status(p, deprecate && len(p) >= 7)
				break
			}
		}
		if r.status&mysql.SERVER_MORE_RESULTS_EXISTS == 0 {
			return r
		}
	}
}

// send writes a command and reads its response with wireResp.
func (rc *rawClient) send(p []byte, cursor bool) rawResp {
	rc.t.Helper()
	rc.write(0, p)
	return rc.wireResp(p[0], cursor)
}

func stmtCmd(cmd byte, id uint32, rest ...byte) []byte {
	return append([]byte{cmd, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24)}, rest...)
}

// executeInt is COM_STMT_EXECUTE with one INT parameter.
func executeInt(id uint32, flags byte, v uint32) []byte {
	return stmtCmd(mysql.COM_STMT_EXECUTE, id, flags, 1, 0, 0, 0, 0, 1, mysql.MYSQL_TYPE_LONG, 0,
		byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

// bulkStrings is COM_STMT_BULK_EXECUTE with string parameters, one row
// per entry.
func bulkStrings(id uint32, rows ...[]string) []byte {
	p := stmtCmd(comStmtBulkExecute, id, 0x80, 0) // STMT_BULK_FLAG_CLIENT_SEND_TYPES
	for range rows[0] {
		p = append(p, mysql.MYSQL_TYPE_VAR_STRING, 0)
	}
	for _, row := range rows {
		for _, v := range row {
			p = appendLenencString(append(p, 0), v) // indicator: a value follows
		}
	}
	return p
}

// capsScript runs the statements of the differential on one connection
// and returns every response; the PREPARE OK's statement id is zeroed
// (MariaDB numbers statements server-wide).
func capsScript(t *testing.T, rc *rawClient) [][]byte {
	t.Helper()
	var out [][]byte
	keep := func(r rawResp) rawResp {
		out = append(out, bytes.Join(r.packets, nil))
		return r
	}
	q := func(s string) rawResp { return keep(rc.send(query(s), false)) }
	prepare := func(s string) uint32 {
		t.Helper()
		r := rc.send(append([]byte{mysql.COM_STMT_PREPARE}, s...), false)
		p := r.packets[0][4:]
		if p[0] != mysql.OK_HEADER {
			t.Fatalf("prepare %s: %q", s, p)
		}
		id := uint32(p[1]) | uint32(p[2])<<8 | uint32(p[3])<<16 | uint32(p[4])<<24
		clear(p[1:5])
		keep(r)
		return id
	}
	q("CREATE TABLE caps_diff (id INT AUTO_INCREMENT PRIMARY KEY, j JSON, u UUID, i6 INET6, v VARCHAR(20) UNIQUE)")
	q("CREATE PROCEDURE caps_diff_proc() BEGIN SELECT id, j FROM caps_diff ORDER BY id LIMIT 2; SELECT u FROM caps_diff LIMIT 1; END")
	q(`INSERT INTO caps_diff (j, u, i6, v) VALUES ('{"a": 1}', 'e2f5f6a0-1111-2222-3333-444455556666', '::1', 'one'),
		('[1, "😂"]', '00000000-0000-0000-0000-000000000001', '2001:db8::ff00:42:8329', 'two')`)
	q("SELECT * FROM caps_diff ORDER BY id")
	q("SELECT JSON_EXTRACT(j, '$[1]') AS e, CAST('::' AS INET6) AS z, UUID() IS NOT NULL FROM caps_diff ORDER BY id")
	q("SELECT * FROM caps_diff WHERE 1 = 0")
	q("SELECT 1; SELECT j FROM caps_diff ORDER BY id LIMIT 1")
	sel := prepare("SELECT id, j, u, i6, v FROM caps_diff WHERE id >= ? ORDER BY id")
	keep(rc.send(executeInt(sel, 0, 1), false))
	keep(rc.send(executeInt(sel, 0, 2), false)) // metadata cached
	if r := keep(rc.send(executeInt(sel, mysql.CURSOR_TYPE_READ_ONLY, 1), true)); r.status&mysql.SERVER_STATUS_CURSOR_EXISTS == 0 {
		t.Fatalf("no cursor opened: status %#x", r.status)
	}
	keep(rc.send(stmtCmd(mysql.COM_STMT_FETCH, sel, 1, 0, 0, 0), false))
	keep(rc.send(stmtCmd(mysql.COM_STMT_FETCH, sel, 10, 0, 0, 0), false))
	none := prepare("SELECT id FROM caps_diff WHERE id < ?")
	keep(rc.send(executeInt(none, mysql.CURSOR_TYPE_READ_ONLY, 0), true))
	ins := prepare("INSERT INTO caps_diff (j, u, i6, v) VALUES (?, ?, ?, ?)")
	keep(rc.send(bulkStrings(ins,
		[]string{`{"b": 2}`, "11111111-2222-3333-4444-555555555555", "fe80::1", "three"},
		[]string{`[]`, "11111111-2222-3333-4444-555555555556", "::ffff:10.0.0.1", "four"}), false))
	keep(rc.send(bulkStrings(lastStmtID, []string{`null`, "11111111-2222-3333-4444-555555555557", "::2", "five"}), false))
	var big [][]string // over streamFrom: relayed as it arrives
	for i := range 400 {
		big = append(big, []string{fmt.Sprintf(`{"row": %d, "pad": "%s"}`, i, strings.Repeat("p", 40)),
			fmt.Sprintf("31111111-2222-3333-4444-%012d", i), fmt.Sprintf("2001:db8::%x", i), fmt.Sprintf("big %d", i)})
	}
	if p := bulkStrings(ins, big...); len(p) <= streamFrom {
		t.Fatalf("the big bulk has %d bytes", len(p))
	}
	keep(rc.send(bulkStrings(ins, big...), false))
	q("SELECT COUNT(*), SUM(LENGTH(j)) FROM caps_diff")
	keep(rc.send(bulkStrings(ins, []string{`1`, "11111111-2222-3333-4444-555555555558", "::3", "one"}), false)) // duplicate
	ret := prepare("INSERT INTO caps_diff (j, u, i6, v) VALUES (?, ?, ?, ?) RETURNING id, j, u")
	keep(rc.send(bulkStrings(ret,
		[]string{`{"c": 3}`, "21111111-2222-3333-4444-555555555555", "::4", "six"},
		[]string{`{"d": 4}`, "21111111-2222-3333-4444-555555555556", "::5", "seven"}), false))
	q("ALTER TABLE caps_diff ADD COLUMN w INT")
	keep(rc.send(executeInt(sel, 0, 5), false)) // metadata changed: sent again
	call := prepare("CALL caps_diff_proc()")
	keep(rc.send(stmtCmd(mysql.COM_STMT_EXECUTE, call, mysql.CURSOR_TYPE_READ_ONLY, 1, 0, 0, 0), true))
	keep(rc.send(append([]byte{mysql.COM_FIELD_LIST}, "caps_diff\x00"...), false))
	q("SELECT * FROM no_such_table_caps")
	keep(rc.send(stmtCmd(mysql.COM_STMT_CLOSE, sel), false))
	keep(rc.send(stmtCmd(mysql.COM_STMT_EXECUTE, 0x7ffffff0, 0, 1, 0, 0, 0), false)) // no such statement
	keep(rc.send([]byte{mysql.COM_PING}, false))
	q("DROP PROCEDURE caps_diff_proc")
	q("DROP TABLE caps_diff")
	return out
}

// TestExtendedCapabilitiesDifferential runs the same statements with
// MariaDB's extended capabilities and DEPRECATE_EOF, in three
// combinations, directly and through rgproxy: every response must be the
// same, byte for byte. Column definitions carry extended type info (json,
// uuid, inet6), executes leave out cached metadata, a cursor opens without
// the EOF after the definitions, bulk inserts answer OK or rows.
func TestExtendedCapabilitiesDifferential(t *testing.T) {
	setupSchema(t)
	pol := &attrPolicy{}
	_, addr := startProxy(t, Config{Policy: pol})
	base := rawCaps | mysql.CLIENT_MULTI_STATEMENTS
	for _, c := range []struct {
		name  string
		caps  uint32
		maria uint32
	}{
		{"DEPRECATE_EOF and MariaDB's", base | mysql.CLIENT_DEPRECATE_EOF, supportedMariaCaps},
		{"MariaDB's only", base, supportedMariaCaps},
		{"DEPRECATE_EOF and bulk only", base | mysql.CLIENT_DEPRECATE_EOF, mariaStmtBulk},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct := dialRawCaps(t, backendAddr, "root", "", c.caps, c.maria)
			proxied := dialRawCaps(t, addr, "root", "", c.caps, c.maria)
			if proxied.caps != direct.caps || proxied.maria != direct.maria || proxied.maria != c.maria {
				t.Fatalf("negotiated %#x/%#x through rgproxy, %#x/%#x directly", proxied.caps, proxied.maria, direct.caps, direct.maria)
			}
			for _, rc := range []*rawClient{direct, proxied} {
				rc.send(append([]byte{mysql.COM_INIT_DB}, "rgproxy_test"...), false)
			}
			clean := func(rc *rawClient) {
				rc.send(query("DROP TABLE IF EXISTS caps_diff"), false)
				rc.send(query("DROP PROCEDURE IF EXISTS caps_diff_proc"), false)
			}
			clean(direct)
			want := capsScript(t, direct)
			clean(proxied)
			got := capsScript(t, proxied)
			if len(got) != len(want) {
				t.Fatalf("%d responses through rgproxy, %d directly", len(got), len(want))
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Errorf("response %d differs:\nrgproxy %q\ndirect  %q", i, got[i], want[i])
				}
			}
			// The policy's own query on the session's backend, and its
			// result set, speak the session's capabilities too.
			r := proxied.send(query("rgp:backend"), false)
			last := r.packets[len(r.packets)-1][4:]
			packets := 5 // count, definition, EOF, row, EOF
			if c.caps&mysql.CLIENT_DEPRECATE_EOF != 0 {
				packets = 4
			}
			if len(r.packets) != packets || last[0] != 0xfe || !bytes.Contains(bytes.Join(r.packets, nil), []byte("\x06policy")) {
				t.Errorf("policy reply %q", r.packets)
			}
			if r := proxied.send([]byte{mysql.COM_PING}, false); r.packets[0][4] != mysql.OK_HEADER {
				t.Errorf("ping after the policy's reply: %q", r.packets)
			}
			if c.maria&mariaExtendedTypeInfo != 0 && !bytes.Contains(bytes.Join(want, nil), []byte("\x04json")) {
				t.Error("no extended type info in the responses")
			}
		})
	}
	// The bulk inserts reached the policy as writes of their prepared
	// statement, their parameter rows counted as request bytes.
	pol.mu.Lock()
	defer pol.mu.Unlock()
	bulks := 0
	for _, s := range pol.stmts {
		if s.st.Command != comStmtBulkExecute {
			continue
		}
		bulks++
		if s.st.Class != sqlscan.ClassWrite || !strings.HasPrefix(s.st.Query, "INSERT INTO caps_diff") ||
			s.out.RequestBytes != s.st.PayloadBytes || s.st.PayloadBytes < 40 {
			t.Errorf("bulk statement %+v outcome %+v", s.st, s.out)
		}
	}
	if bulks != 3*5 {
		t.Errorf("%d bulk executes reached the policy, want 15", bulks)
	}
	if i := slices.IndexFunc(pol.stmts, func(s recStmt) bool {
		return s.st.Command == comStmtBulkExecute && s.out.ErrCode == mysql.ER_DUP_ENTRY
	}); i < 0 {
		t.Error("the failing bulk insert's error did not reach the policy")
	}
}

// refusePolicy answers every COM_STMT_BULK_EXECUTE and COM_STMT_EXECUTE
// with an error of its own.
type refusePolicy struct{ attrPolicy }

func (p *refusePolicy) Open(SessionInfo) SessionPolicy { return p }
func (p *refusePolicy) Before(ctx context.Context, st *Statement, be Backend) Verdict {
	if st.Command == comStmtBulkExecute || st.Command == mysql.COM_STMT_EXECUTE {
		return Verdict{Reply: &Reply{Err: &Error{Code: 8252, Message: "Exceeded resource group quota limitation"}}}
	}
	return Verdict{}
}

// TestStreamedCommandRefused: a large bulk or execute, relayed as it
// arrives when forwarded, is read to its end when the policy answers it
// instead, so that the session goes on with the client's next command.
func TestStreamedCommandRefused(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{Policy: &refusePolicy{}})
	rc := dialRawCaps(t, addr, "root", "", rawCaps, mariaStmtBulk)
	rc.send(append([]byte{mysql.COM_INIT_DB}, "rgproxy_test"...), false)
	rc.send(query("CREATE TABLE IF NOT EXISTS caps_refused (v TEXT)"), false)
	r := rc.send(append([]byte{mysql.COM_STMT_PREPARE}, "INSERT INTO caps_refused VALUES (?)"...), false)
	id := uint32(r.packets[0][5]) | uint32(r.packets[0][6])<<8 | uint32(r.packets[0][7])<<16 | uint32(r.packets[0][8])<<24
	var rows [][]string
	for range 100 {
		rows = append(rows, []string{strings.Repeat("r", 1000)})
	}
	long := appendLenencString(stmtCmd(mysql.COM_STMT_EXECUTE, id, 0, 1, 0, 0, 0, 0, 1, mysql.MYSQL_TYPE_VAR_STRING, 0),
		strings.Repeat("e", 3*streamFrom))
	for _, p := range [][]byte{bulkStrings(id, rows...), long} {
		if len(p) <= streamFrom {
			t.Fatalf("command of %d bytes is not streamed", len(p))
		}
		r := rc.send(p, false)
		if got := r.packets[0][4:]; got[0] != mysql.ERR_HEADER || got[1] != byte(8252&0xff) {
			t.Fatalf("command 0x%02x: %q, want the policy's error", p[0], got)
		}
		if r := rc.send([]byte{mysql.COM_PING}, false); r.packets[0][4] != mysql.OK_HEADER {
			t.Fatalf("ping after a refused command: %q", r.packets[0])
		}
	}
	rc.send(query("DROP TABLE caps_refused"), false)
}
