package rgpolicy

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// This file makes the DDL that writes outside its statement pay, or
// refuses it:
//
//   - events: the event scheduler runs an event's body later, as its
//     definer, on a thread of the server's own: no session rgproxy sees
//     runs it, and the binary log shows its rows under no session's
//     transaction. Charging them to the definer's group would need the
//     log to name the definer, which it does not (a row event carries a
//     table and rows; the transaction's BEGIN carries the scheduler's
//     thread id, which no client connection has). So in strict mode an
//     account whose statements run in a limited group may not CREATE or
//     ALTER an event (1227, saying why); an administrator may. Outside
//     strict mode any account may leave its group for default anyway
//     (SET RESOURCE GROUP), so refusing would protect nothing: events run
//     there, unpriced.
//   - copying DDL: ALTER TABLE that copies or rebuilds a table, and
//     OPTIMIZE TABLE, write the whole table while the binary log shows one
//     statement. They pay the table's size (information_schema.TABLES
//     DATA_LENGTH + INDEX_LENGTH) as written bytes, as the estimate charges
//     (late, through the ledger), whatever the write source (but packet).

// eventWords are the Scan.Mentions bits of the words a statement that
// creates or alters an event holds: event itself, or prepare / immediate
// (the text in a literal, which the scan does not read).
var eventWords = func() uint64 {
	var bits uint64
	for i, w := range ScanWords() {
		if w == "event" || w == "prepare" || w == "immediate" {
			bits |= 1 << i
		}
	}
	return bits
}()

// limited: the group throttles (ENFORCE, a finite RU_PER_SEC, a bounded
// burst).
func limited(g resourcegroup.Group) bool {
	return g.Mode == resourcegroup.ModeEnforce && g.RUPerSec != resourcegroup.Unlimited && g.Burst != resourcegroup.BurstUnlimited
}

// refuseEvent is Before's check, after resolve, that in strict mode a
// session of a limited group creates or alters no event unless it
// administers resource groups; nil lets the statement on.
func (s *session) refuseEvent(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend, set *Settings) *mysqlproto.Reply {
	if !set.Strict || st.Scan.Mentions&eventWords == 0 ||
		(st.Command != mysql.COM_QUERY && st.Command != mysql.COM_STMT_PREPARE) {
		return nil
	}
	group := ""
	for _, name := range [3]string{s.cur.group, s.cur.tagGroup, s.cur.shapeGroup} {
		if g, ok := s.group(name); name != "" && ok && limited(g) {
			group = name
			break
		}
	}
	if group == "" || !(sqlscan.EventDDL(st.Query, st.Mode()) || s.dynamicEvent(ctx, st, be)) || s.hasSuperFresh(ctx, be) {
		return nil
	}
	g, _ := s.group(group)
	return &mysqlproto.Reply{Err: mysqlError(resourcegroup.NewAccessDenied(fmt.Sprintf(
		"the account %s runs in resource group %s (RU_PER_SEC %d) and --strict-resource-groups is on: "+
			"an event runs later as its definer, outside any session rgproxy meters, so what it writes would be charged to no group; "+
			"CREATE EVENT and ALTER EVENT need %s (DROP EVENT is allowed)",
		s.account(), group, g.RUPerSec, adminWays)))}
}

// dynamicEvent reports whether a PREPARE ... FROM @v or EXECUTE IMMEDIATE
// @v would run a text that creates or alters an event: it reads @v on the
// session's connection before the statement (a SELECT of a variable,
// which changes none of the session's warnings) and reads its value as
// the server would. A variable it cannot name safely, or a failed read,
// says no.
func (s *session) dynamicEvent(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) bool {
	if st.Command != mysql.COM_QUERY || st.Multi {
		return false
	}
	name, ok := sqlscan.DynamicVar(st.Query, st.Mode())
	if !ok {
		return false
	}
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, "SELECT @`"+name+"`") // name: ASCII letters, digits, _ and $ only
	if err != nil || len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] == nil {
		return false
	}
	return sqlscan.EventDDL(*rows[0][0], st.Mode())
}

// copyState is what Before read of a statement that may copy tables, for
// FollowUp.
type copyState struct {
	// tables are the tables the statement names (none: not copying DDL).
	tables []sqlscan.Table
	// rebuild: a clause rebuilds them (sqlscan.CopyDDL.Rebuild); alter:
	// an ALTER TABLE alone, whose affected rows are the rows it copied.
	rebuild bool
	alter   bool
	// before is their size before the statement (bytes; -1 unknown).
	before float64
}

// maxCopyStatements bounds the statements of a multi-statement read for
// copying DDL.
const maxCopyStatements = 64

// copyBefore reads, before the statement runs, whether it may copy or
// rebuild tables (ALTER TABLE, OPTIMIZE TABLE, as text, EXECUTE IMMEDIATE
// 'text', a multi-statement's parts, or a prepared statement's text) and
// their size then: the statistics may be stale (InnoDB refreshes them in
// the background), so FollowUp reads them again after a rebuild, which
// refreshes them.
func (s *session) copyBefore(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) {
	s.cp = copyState{}
	// ALTER and OPTIMIZE are writes; EXECUTE IMMEDIATE is other.
	if s.p.writes.source == WritePacket || (st.Class != sqlscan.ClassWrite && st.Class != sqlscan.ClassOther) {
		return
	}
	switch st.Command {
	case mysql.COM_QUERY, mysql.COM_STMT_EXECUTE, comStmtBulkExecute:
	default:
		return
	}
	if !st.Multi {
		// The usual write: one 64-byte look, no allocation.
		switch sqlscan.FirstWord(st.Query, st.Mode()) {
		case "ALTER", "OPTIMIZE", "EXECUTE":
		default:
			return
		}
	}
	texts := []string{st.Query}
	if st.Multi {
		texts = texts[:0]
		for i, part := range sqlscan.SplitStatements([]byte(st.Query), st.Mode()) {
			if i == maxCopyStatements {
				break
			}
			texts = append(texts, string(part))
		}
	}
	cp := copyState{before: -1}
	for _, q := range texts {
		switch sqlscan.FirstWord(q, st.Mode()) {
		case "ALTER", "OPTIMIZE", "EXECUTE":
		default:
			continue
		}
		d, ok := sqlscan.ReadCopyDDL(q, st.Mode())
		if !ok {
			continue
		}
		cp.rebuild = cp.rebuild || d.Rebuild
		cp.alter = d.Verb == "ALTER" && !st.Multi
		for _, t := range d.Tables {
			if len(cp.tables) < sqlscan.MaxCopyTables {
				cp.tables = append(cp.tables, t)
			}
		}
	}
	if len(cp.tables) == 0 {
		return
	}
	cp.before, _ = s.tablesSize(ctx, be, cp.tables)
	s.cp = cp
}

// copyFollowUp charges, once the statement's response is with the client
// and the rest of FollowUp has run,
// the size of the tables it copied or rebuilt as written bytes beyond its
// packet (which its before-cost charged): after a rebuild clause, or an
// ALTER TABLE that reported rows copied. It reads the size again first
// (a rebuild leaves fresh statistics) unless the statement left warnings,
// which the query would clear for SHOW WARNINGS; then, or when the table
// is gone (renamed), the size read before stands. A statement that failed
// pays the size read before, unless its error says the server refused it
// before any row was copied (copyNotRun).
func (s *session) copyFollowUp(ctx context.Context, st *mysqlproto.Statement, out *mysqlproto.Outcome, be mysqlproto.Backend) {
	cp := s.cp
	s.cp = copyState{}
	cur := &s.cur
	if len(cp.tables) == 0 || out.NotForwarded || cur.req.Class == ru.ClassFree || !s.last.valid || s.series == nil {
		return
	}
	if !cp.rebuild && !(cp.alter && out.AffectedRows > 0 && out.ErrCode == 0) {
		return
	}
	size := cp.before
	switch {
	case out.ErrCode != 0:
		if copyNotRun[out.ErrCode] {
			return
		}
	case out.Warnings == 0:
		if after, ok := s.tablesSize(ctx, be, cp.tables); ok && after > 0 {
			size = after
		}
	}
	more := size
	if !st.Multi {
		more -= max(s.last.cost.WriteBytes, 0) // its packet, charged
	}
	if more <= 0 {
		return
	}
	to := s.led.lateTargets(cur, s.series, !st.InTransaction && !out.InTransaction)
	s.led.late(&to, ru.Consumption{WRU: more * s.p.cost.WriteCostPerByte, WriteBytes: more}, srcEstimate, true)
	if s.last.write == nil {
		s.last.write = &writeResult{source: srcEstimate}
	}
}

// copyNotRun are the errors with which the server refuses an ALTER or
// OPTIMIZE TABLE before it copies a row: parse errors, privileges, names
// that do not exist or clash, an algorithm the change does not support.
var copyNotRun = map[uint16]bool{
	mysql.ER_PARSE_ERROR: true, mysql.ER_TABLEACCESS_DENIED_ERROR: true, mysql.ER_COLUMNACCESS_DENIED_ERROR: true,
	mysql.ER_DBACCESS_DENIED_ERROR: true, mysql.ER_SPECIFIC_ACCESS_DENIED_ERROR: true, mysql.ER_NO_SUCH_TABLE: true,
	mysql.ER_BAD_DB_ERROR: true, mysql.ER_BAD_FIELD_ERROR: true, mysql.ER_CANT_DROP_FIELD_OR_KEY: true,
	mysql.ER_DUP_FIELDNAME: true, mysql.ER_DUP_KEYNAME: true, mysql.ER_MULTIPLE_PRI_KEY: true,
	mysql.ER_TABLE_EXISTS_ERROR: true, mysql.ER_NO_DB_ERROR: true, mysql.ER_UNKNOWN_STORAGE_ENGINE: true,
	1845: true, // ER_ALTER_OPERATION_NOT_SUPPORTED
	1846: true, // ER_ALTER_OPERATION_NOT_SUPPORTED_REASON
}

// tablesSize reads the summed DATA_LENGTH + INDEX_LENGTH of tables from
// information_schema.TABLES on the session's own connection (it sees the
// tables the session may alter), and the session's current database. The
// names go as hex literals, never as quoted text. ok is false when the
// query failed; a table it cannot find adds nothing.
func (s *session) tablesSize(ctx context.Context, be mysqlproto.Backend, tables []sqlscan.Table) (float64, bool) {
	var b strings.Builder
	b.WriteString("SELECT DATABASE(), (SELECT SUM(DATA_LENGTH + INDEX_LENGTH) FROM information_schema.TABLES WHERE ")
	for i, t := range tables {
		if i > 0 {
			b.WriteString(" OR ")
		}
		schema := "DATABASE()"
		if t.Schema != "" {
			schema = "X'" + hex.EncodeToString([]byte(t.Schema)) + "'"
		}
		b.WriteString("(TABLE_SCHEMA = " + schema + " AND TABLE_NAME = X'" + hex.EncodeToString([]byte(t.Table)) + "')")
	}
	b.WriteString(")")
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, b.String())
	if err != nil || len(rows) != 1 || len(rows[0]) != 2 {
		s.p.logger.Debug("reading the size of the tables a DDL statement copies failed: it pays its packet", "err", err)
		return -1, false
	}
	s.wr.db, s.wr.dbKnown = "", true
	if rows[0][0] != nil {
		s.wr.db = *rows[0][0]
	}
	var size float64
	if rows[0][1] != nil {
		size, _ = strconv.ParseFloat(*rows[0][1], 64)
	}
	return max(size, 0), true
}
