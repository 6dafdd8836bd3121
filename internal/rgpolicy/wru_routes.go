package rgpolicy

import (
	"context"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// This file holds the write routes the claim of one transaction after one
// statement (wru.go) does not see (issue 29):
//
//   - XA: an XA transaction's rows are logged by XA PREPARE (in a group of
//     its own, whose GTID @@last_gtid then names), not by XA COMMIT, which
//     may come from another session. The session claims them at XA
//     PREPARE (or at XA COMMIT ... ONE PHASE, logged as an ordinary
//     transaction): the bytes pay when they are written, by the session
//     that wrote them, and an XA ROLLBACK after the prepare gives nothing
//     back.
//   - several transactions in one statement (binlog, MariaDB): a
//     multi-statement packet, a CALL, or a statement that implicitly
//     commits an open transaction (DDL, BEGIN, ...) may commit several, and
//     @@last_gtid names the last only, while MariaDB's log records no
//     session for DML. The session's Binlog_bytes_written status counter,
//     read before and after, holds every byte the session's transactions
//     logged: the packet pays that, less its own text once more when the
//     log annotates rows events with their statements (the text is there;
//     its packet paid it), charged at once.
//   - user variables (estimate): a write that reads @v into a table whose
//     AVG_ROW_LENGTH the estimate does not trust (new, small) pays at least
//     affected rows × the bytes of the variables it reads, asked of the
//     backend before it runs.

// routeHead is what writesBefore read of a statement for this file's
// routes.
type routeHead struct {
	xa       sqlscan.XAStep
	onePhase bool
	// logged is the session's Binlog_bytes_written before a statement
	// that may commit several transactions (loggedKnown: read).
	logged      float64
	loggedKnown bool
	// varBytes is the size of the user variables the statement reads
	// (estimate).
	varBytes float64
}

// xaState is a session's XA transaction between XA START and XA PREPARE
// (binlog): the written bytes its statements' packets paid, and whether
// one may have written.
type xaState struct {
	active bool
	bytes  float64
	wrote  bool
}

// maxVarBytes caps what the backend says a statement's variables hold
// (1 TiB): a number from the backend is bounded like any other.
const maxVarBytes = 1 << 40

// routesBefore reads what this file's routes need of a statement before
// it runs, into h.
func (s *session) routesBefore(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend, h *stmtHead) {
	src := s.p.writes.inForce()
	if st.Command != mysql.COM_QUERY && st.Command != mysql.COM_STMT_EXECUTE {
		return
	}
	verb := h.Verb
	if verb == "" && !st.Multi {
		verb = sqlscan.FirstWord(st.Query, st.Mode())
	}
	switch src {
	case srcBinlog:
		if verb == "XA" && !st.Multi {
			h.route.xa, h.route.onePhase = sqlscan.ReadXA(st.Query, st.Mode())
		}
		several := st.Multi || verb == "CALL" || (st.InTransaction && !st.Scan.EndsTxn && implicitCommit[verb])
		if several && s.p.writes.binlog.Attribution() == binlog.AttributeGTID {
			h.route.logged, h.route.loggedKnown = s.loggedBytes(ctx, be)
			h.mayWrite = true
		}
	case srcEstimate:
		if st.Multi || (st.Class != sqlscan.ClassWrite && verb != "EXECUTE") || verb == "DELETE" {
			return
		}
		if names, all := sqlscan.UserVars(st.Query, st.Mode()); all || len(names) > 0 {
			h.route.varBytes = s.varBytes(ctx, be, names, all)
		}
	}
}

// implicitCommit are the first words of statements that commit an open
// transaction before they run (MariaDB's "statements that cause an
// implicit commit"; SET autocommit = 1 aside, which would put two queries
// on every SET inside a transaction): the transaction and the statement
// are then two transactions, and @@last_gtid names the statement's.
var implicitCommit = map[string]bool{
	"ALTER": true, "ANALYZE": true, "BEGIN": true, "CREATE": true, "DROP": true,
	"FLUSH": true, "GRANT": true, "INSTALL": true, "LOCK": true, "OPTIMIZE": true,
	"RENAME": true, "REPAIR": true, "RESET": true, "REVOKE": true, "START": true, "TRUNCATE": true,
	"UNINSTALL": true, "UNLOCK": true,
}

// loggedBytes reads the session's Binlog_bytes_written.
func (s *session) loggedBytes(ctx context.Context, be mysqlproto.Backend) (float64, bool) {
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'BINLOG_BYTES_WRITTEN'")
	if err != nil || len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] == nil {
		s.p.logger.Debug("reading Binlog_bytes_written failed: the statement's last transaction pays", "err", err)
		return 0, false
	}
	return parseBytes(*rows[0][0])
}

// varBytes reads the size of the user variables names (all: of every
// variable of the session) on the session's connection. Names are plain
// (sqlscan.UserVars), written unquoted.
func (s *session) varBytes(ctx context.Context, be mysqlproto.Backend, names []string, all bool) float64 {
	q := "SELECT COALESCE(SUM(LENGTH(VARIABLE_VALUE)), 0) FROM information_schema.USER_VARIABLES"
	if !all {
		var b strings.Builder
		b.WriteString("SELECT 0")
		for _, n := range names {
			b.WriteString(" + COALESCE(LENGTH(@")
			b.WriteString(n)
			b.WriteString("), 0)")
		}
		q = b.String()
	}
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, q)
	if err != nil || len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] == nil {
		s.p.logger.Debug("reading the size of a statement's user variables failed", "err", err)
		return 0
	}
	n, _ := parseBytes(*rows[0][0])
	return n
}

// parseBytes reads a byte count the backend sent, bounded.
func parseBytes(v string) (float64, bool) {
	n, err := strconv.ParseFloat(v, 64)
	if err != nil || n != n || n < 0 {
		return 0, false
	}
	return min(n, maxVarBytes), true
}

// routeStep is what routesFollowUp decided: handled, the statement is
// settled (claim: claim the session's last transaction from the binary
// log, with charged bytes already paid); otherwise FollowUp goes on as
// for any statement.
type routeStep struct {
	handled bool
	claim   bool
	charged float64
}

// routesFollowUp settles a statement of this file's binlog routes after
// it ran; written is what its packet paid as written bytes.
func (s *session) routesFollowUp(ctx context.Context, st *mysqlproto.Statement, out *mysqlproto.Outcome, be mysqlproto.Backend,
	h stmtHead, to *lateTo, written float64) routeStep {
	if s.p.writes.inForce() != srcBinlog {
		return routeStep{}
	}
	w := &s.wr
	if h.route.loggedKnown {
		return s.severalFollowUp(ctx, st, out, be, h, to, written)
	}
	ok := out.ErrCode == 0
	switch h.route.xa {
	case sqlscan.XAStart:
		if ok {
			w.xa = xaState{active: true}
			w.txnBytes, w.txnWrote = 0, false
		}
		return routeStep{handled: true}
	case sqlscan.XAPrepare, sqlscan.XACommit:
		x := w.xa
		w.xa = xaState{}
		if !x.active {
			return routeStep{handled: true} // the rows were claimed at XA PREPARE
		}
		return routeStep{handled: true, claim: ok && x.wrote, charged: x.bytes + written}
	case sqlscan.XARollback:
		w.xa = xaState{}
		return routeStep{handled: true}
	}
	if w.xa.active {
		// A statement of the XA transaction: its bytes wait for XA PREPARE.
		w.xa.bytes += written
		w.xa.wrote = w.xa.wrote || h.mayWrite
		return routeStep{handled: true}
	}
	return routeStep{}
}

// severalFollowUp settles a statement that may have committed several
// transactions (see the top of this file) from the session's
// Binlog_bytes_written before and after it.
func (s *session) severalFollowUp(ctx context.Context, st *mysqlproto.Statement, out *mysqlproto.Outcome, be mysqlproto.Backend,
	h stmtHead, to *lateTo, written float64) routeStep {
	w := &s.wr
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, "SELECT @@last_gtid, VARIABLE_VALUE, @@session.binlog_annotate_row_events "+
		"FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'BINLOG_BYTES_WRITTEN'")
	if err != nil || len(rows) != 1 || len(rows[0]) != 3 || rows[0][1] == nil {
		s.p.logger.Debug("reading Binlog_bytes_written failed: the statement's last transaction pays", "err", err)
		return routeStep{}
	}
	if rows[0][0] != nil {
		w.lastGTID = *rows[0][0]
	}
	now, ok := parseBytes(*rows[0][1])
	logged := now - h.route.logged
	if !ok || logged <= 0 {
		if out.InTransaction {
			return routeStep{} // nothing committed yet: the transaction's end pays
		}
		w.txnBytes, w.txnWrote = 0, false
		return routeStep{handled: true}
	}
	charged := written
	if st.InTransaction {
		charged += w.txnBytes
	}
	// The log holds the statements' texts too (Annotate_rows), which
	// their packets paid.
	var text float64
	if rows[0][2] != nil && *rows[0][2] == "1" {
		text = charged
	}
	if more := logged - text - charged; more > 0 {
		s.led.late(to, ru.Consumption{WRU: more * s.p.cost.WriteCostPerByte, WriteBytes: more}, srcBinlog, true)
	}
	s.last.write = &writeResult{source: srcBinlog}
	// A transaction the statement left open pays at its end, in full.
	w.txnBytes, w.txnWrote = 0, out.InTransaction
	return routeStep{handled: true}
}
