package mysqlproto

import (
	"bytes"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/sqltext"
)

// What a statement's text says about character_set_client: the scan's
// verdict, which the session follows after the statement.
func TestCharsetEffect(t *testing.T) {
	to := func(cs sqltext.Charset) csEffect { return csEffect{kind: csTo, to: cs} }
	ask := csEffect{kind: csAsk}
	prep := csEffect{kind: csPrepared}
	tests := []struct {
		q    string
		want csEffect
	}{
		{"SELECT 1", csEffect{}},
		{"SET NAMES gbk", to(sqltext.GBK)},
		{"set names 'GBK' collate 'gbk_bin'", to(sqltext.GBK)},
		{"SET NAMES `big5`", to(sqltext.Big5)},
		{"SET NAMES utf8mb4", to(sqltext.ASCIISafe)},
		{"SET NAMES DEFAULT", ask},
		{"SET CHARACTER SET sjis", to(sqltext.SJIS)},
		{"SET CHARSET \"cp932\"", to(sqltext.SJIS)},
		{"SET character_set_client = gbk", to(sqltext.GBK)},
		{"SET SESSION character_set_client := 'big5'", to(sqltext.Big5)},
		{"SET @@character_set_client = gbk", to(sqltext.GBK)},
		{"SET @@session.character_set_client = gbk, @x = 1", to(sqltext.GBK)},
		{"SET @@local.character_set_client = 28", to(sqltext.GBK)},
		{"SET character_set_client = @v", ask},
		{"SET character_set_client = DEFAULT", ask},
		{"SET character_set_client = concat('g', 'bk')", ask},
		{"SET GLOBAL character_set_client = gbk", ask},
		{"SET @@global.character_set_client = gbk", ask},
		{"SET @x = 1, NAMES latin1", to(sqltext.ASCIISafe)},
		{"SET @x = (SELECT 'a, NAMES gbk'), @y = 2", csEffect{}},
		{"SET character_set_connection = gbk", csEffect{}},
		{"SET autocommit = 0", csEffect{}},
		{"SET STATEMENT max_statement_time = 1 FOR SELECT 1", csEffect{}},
		{"SET NAMES gbk; SELECT 1", to(sqltext.GBK)},
		{"SELECT 1; SET NAMES gbk", to(sqltext.GBK)},
		{"PREPARE s FROM 'SET NAMES gbk'", prep},
		{"EXECUTE s", prep},
		{"EXECUTE IMMEDIATE 'SET NAMES gbk'", prep},
		{"DEALLOCATE PREPARE s", prep},
		{"DROP PREPARE s", prep},
		{"DROP TABLE t", csEffect{}},
		{"SELECT 1; EXECUTE s", ask},
		{"CALL p()", csEffect{}},
	}
	for _, tt := range tests {
		var res Scan
		scanQuery([]byte(tt.q), sqltext.Mode{}, nil, &res, nil, false)
		if res.cs != tt.want {
			t.Errorf("%q: effect %+v, want %+v", tt.q, res.cs, tt.want)
		}
	}
}

// After a SET NAMES of a known character set, the server reads the rest
// of a multi-statement in it, and so does the scan.
func TestScanSwitchesCharsetInMulti(t *testing.T) {
	// In gbk the string ends after 0x81 0x5C and the DELETE is a statement.
	q := "SET NAMES gbk; SELECT '\x81\\'; DELETE FROM t; -- '"
	if c, multi := ClassifyQueryMode([]byte(q), sqltext.Mode{}); c != ClassWrite || !multi {
		t.Errorf("ClassifyQueryMode(%q) = %v, %v; want write, multi", q, c, multi)
	}
	q = "SET NAMES latin1; SELECT '\x81\\'; DELETE FROM t; -- '"
	if c, _ := ClassifyQueryMode([]byte(q), sqltext.Mode{Charset: sqltext.GBK}); c != ClassRead {
		t.Errorf("ClassifyQueryMode(%q) in gbk = %v; want read", q, c)
	}
	parts := SplitStatements([]byte("SET NAMES gbk; SELECT '\x81\\'; SELECT 2"), sqltext.Mode{})
	if len(parts) != 3 {
		t.Errorf("SplitStatements: %q", parts)
	}
}

// A session follows character_set_client through SET NAMES, a reset, a
// prepared SET executed with COM_STMT_EXECUTE and COM_CHANGE_USER's
// collation, against the real backend: the policy sees each statement's
// character set.
func TestSessionFollowsCharset(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	rc := dialRaw(t, addr, "root", "") // collation 45: utf8mb4
	charsetOf := func(q string) sqltext.Charset {
		t.Helper()
		if _, m := rc.cmd(respGeneric, false, query(q)); m.ErrCode != 0 {
			t.Fatalf("%s: error %d", q, m.ErrCode)
		}
		// The policy hears After once the reply is on its way, so the
		// client may read the reply first: wait for this statement's outcome.
		return pol.waitOutcome(t, q).st.Charset
	}
	if cs := charsetOf("SELECT 1"); cs != sqltext.ASCIISafe {
		t.Fatalf("after login: %v", cs)
	}
	charsetOf("SET NAMES gbk")
	if cs := charsetOf("SELECT 2"); cs != sqltext.GBK {
		t.Fatalf("after SET NAMES gbk: %v", cs)
	}
	// MariaDB restores the handshake's character set on a reset; rgproxy asks.
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_RESET_CONNECTION}); m.ErrCode != 0 {
		t.Fatalf("reset: %d", m.ErrCode)
	}
	if cs := charsetOf("SELECT 3"); cs != sqltext.ASCIISafe {
		t.Fatalf("after COM_RESET_CONNECTION: %v", cs)
	}
	_, m := rc.cmd(respPrepare, false, append([]byte{mysql.COM_STMT_PREPARE}, "SET NAMES sjis"...))
	if m.ErrCode != 0 || !m.Prepared {
		t.Fatalf("prepare: %+v", m)
	}
	id := m.StmtID
	if _, m := rc.cmd(respGeneric, true, []byte{mysql.COM_STMT_EXECUTE, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), 0, 1, 0, 0, 0}); m.ErrCode != 0 {
		t.Fatalf("execute: %d", m.ErrCode)
	}
	if cs := charsetOf("SELECT 4"); cs != sqltext.SJIS {
		t.Fatalf("after COM_STMT_EXECUTE of SET NAMES sjis: %v", cs)
	}
	// COM_CHANGE_USER back to root, with collation 28 (gbk_chinese_ci).
	cu := append([]byte{mysql.COM_CHANGE_USER}, "root\x00"...)
	cu = append(cu, 0) // empty auth response
	cu = append(cu, "rgproxy_test\x00"...)
	cu = append(cu, 28, 0)
	cu = append(cu, "mysql_native_password\x00"...)
	rc.write(0, cu)
	rc.finishAuth("")
	if cs := charsetOf("SELECT 5"); cs != sqltext.GBK {
		t.Fatalf("after COM_CHANGE_USER with gbk: %v", cs)
	}
	raw, _ := rc.cmd(respGeneric, false, query("SELECT @@character_set_client"))
	if !bytes.Contains(raw, []byte("gbk")) {
		t.Fatalf("the backend's character_set_client: %q", raw)
	}
}
