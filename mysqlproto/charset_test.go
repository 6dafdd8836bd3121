package mysqlproto

import (
	"bytes"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/sqlscan"
)

// A session follows character_set_client through SET NAMES, a reset, a
// prepared SET executed with COM_STMT_EXECUTE and COM_CHANGE_USER's
// collation, against the real backend: the policy sees each statement's
// character set.
func TestSessionFollowsCharset(t *testing.T) {
	setupSchema(t)
	pol := newRecPolicy()
	_, addr := startProxy(t, Config{Policy: pol})
	rc := dialRaw(t, addr, "root", "") // collation 45: utf8mb4
	charsetOf := func(q string) sqlscan.Charset {
		t.Helper()
		if _, m := rc.cmd(respGeneric, false, query(q)); m.ErrCode != 0 {
			t.Fatalf("%s: error %d", q, m.ErrCode)
		}
		// The policy hears After once the reply is on its way, so the
		// client may read the reply first: wait for this statement's outcome.
		return pol.waitOutcome(t, q).st.Charset
	}
	if cs := charsetOf("SELECT 1"); cs != sqlscan.ASCIISafe {
		t.Fatalf("after login: %v", cs)
	}
	charsetOf("SET NAMES gbk")
	if cs := charsetOf("SELECT 2"); cs != sqlscan.GBK {
		t.Fatalf("after SET NAMES gbk: %v", cs)
	}
	// MariaDB restores the handshake's character set on a reset; rgproxy asks.
	if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_RESET_CONNECTION}); m.ErrCode != 0 {
		t.Fatalf("reset: %d", m.ErrCode)
	}
	if cs := charsetOf("SELECT 3"); cs != sqlscan.ASCIISafe {
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
	if cs := charsetOf("SELECT 4"); cs != sqlscan.SJIS {
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
	if cs := charsetOf("SELECT 5"); cs != sqlscan.GBK {
		t.Fatalf("after COM_CHANGE_USER with gbk: %v", cs)
	}
	raw, _ := rc.cmd(respGeneric, false, query("SELECT @@character_set_client"))
	if !bytes.Contains(raw, []byte("gbk")) {
		t.Fatalf("the backend's character_set_client: %q", raw)
	}
}
