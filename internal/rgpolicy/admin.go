package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/sqlscan"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// admin answers one of rgproxy's own statements; nothing reaches the backend.
func (s *session) admin(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) mysqlproto.Verdict {
	if st.Command == mysql.COM_STMT_PREPARE {
		return errReply(resourcegroup.NewNotAllowedInPrepare())
	}
	if st.Multi {
		return errReply(errAdminInMulti)
	}
	stmt, err := resourcegroup.Parse(st.Query, st.Mode())
	if err != nil {
		return errReply(err)
	}
	set := s.p.settings.Load()
	switch a := stmt.(type) {
	case *resourcegroup.SetGroup:
		name := resourcegroup.NormalizeName(a.Name)
		if _, ok := s.p.tokens.Group(name); !ok {
			return errReply(resourcegroup.NewNotFound(name))
		}
		if !s.mayUse(ctx, name, be, set) {
			return errReply(s.deniedGroup("SET RESOURCE GROUP " + name))
		}
		s.setGroup, s.setGen, s.setSettings = name, s.rt.gen, set
		return mysqlproto.Verdict{Reply: &mysqlproto.Reply{}}
	case *resourcegroup.CurrentGroup:
		return resultReply([]string{"CURRENT_RESOURCE_GROUP()"}, [][]string{{s.currentGroup()}})
	case *resourcegroup.ShowLastStatementRU:
		return s.showLast()
	case *resourcegroup.ShowUsage:
		if a.Cluster {
			return s.showClusterUsage(ctx, be, a.Filter)
		}
		readable, err := s.readableGroups(ctx, be)
		if err != nil {
			return errReply(err)
		}
		t, rows := s.usageTable(readable)
		if a.Filter != "" {
			// LIKE / WHERE: the backend filters a derived table of the
			// rows; the filter is the session's own SQL.
			return mysqlproto.Verdict{Rewrite: "SELECT * FROM " + derivedTable(t) +
				" AS `resource_group_usage` " + likeOnName(a.Filter)}
		}
		return resultReply(usageColumns, rows)
	case *resourcegroup.ShowCreateGroup:
		readable, err := s.readableGroups(ctx, be)
		if err != nil {
			return errReply(err)
		}
		if readable != nil && !readable(resourcegroup.NormalizeName(a.Name)) {
			return errReply(s.deniedRead(resourcegroup.NormalizeName(a.Name)))
		}
	case *resourcegroup.SelectGroups:
		// Only when the rewrite did not find the table (it always
		// should): the same rows as information_schema.resource_groups.
		return s.selectVirtual(ctx, be, vtResourceGroups, a.Columns, a.HasWhere, a.Name)
	case *resourcegroup.SelectWatches:
		return s.selectVirtual(ctx, be, vtRunawayWatches, nil, false, "")
	case *resourcegroup.ExplainGroup:
		return s.explainGroup(ctx, a, be)
	case *resourcegroup.CalibrateResource:
		return s.calibrate(ctx, a, be)
	}
	if resourcegroup.RequiresSuper(stmt) && !s.hasSuperFresh(ctx, be) {
		return errReply(s.deniedStatement(stmt))
	}
	if err := s.checkKillRule(stmt); err != nil {
		return errReply(err)
	}
	if a, ok := stmt.(*resourcegroup.AlterUserGroup); ok {
		// Bindings are per account, which must exist on the backend.
		exists, err := s.accountExists(ctx, be, a.User, a.Host)
		if err != nil {
			return errReply(err)
		}
		if !exists {
			e := errNoAccount(a.User, a.Host)
			if a.IfExists {
				s.notes = []*resourcegroup.Error{{Code: e.Code, State: e.State, Message: e.Message}}
				return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Warnings: 1}}
			}
			return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Err: e}}
		}
	}
	if a, ok := stmt.(*resourcegroup.QueryWatchAdd); ok {
		// What resourcegroup cannot know: the session's group, and the
		// digest of a SIMILAR text.
		if a.Group == "" {
			a.Group = s.currentGroup()
		}
		if a.Match == resourcegroup.WatchSimilar && a.Digest == "" {
			a.Digest = sqlscan.Digest([]byte(a.Text), st.Mode())
		}
	}
	if a, ok := stmt.(*resourcegroup.StmtBinding); ok {
		// TiDB's statement binding: the digest binding of its FOR
		// statement's shape, read in the session's mode.
		if stmt, err = stmtBindingOf(a, st.Mode()); err != nil {
			return errReply(err)
		}
	}
	res, err := resourcegroup.Execute(ctx, stmt, s.p.tokens.Store())
	if err != nil {
		return errReply(err)
	}
	if resourcegroup.RequiresSuper(stmt) {
		s.p.logger.Info("resource group change", "user", s.user, "statement", string(st.Scan.Digest))
	}
	if res.IsResultSet() {
		return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Columns: res.Columns, Rows: res.Rows}}
	}
	// Notes (IF NOT EXISTS of an existing group, IF EXISTS of a missing
	// one) are counted in the OK packet; the SHOW WARNINGS that may follow
	// is answered here.
	s.notes = res.Warnings
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{AffectedRows: res.AffectedRows, Warnings: uint16(min(len(res.Warnings), 65535))}}
}

// showNotes answers SHOW WARNINGS (or SHOW COUNT(*) WARNINGS) right after
// one of rgproxy's own statements that left notes; ok is false for any
// other statement, which forgets them.
func (s *session) showNotes(st *mysqlproto.Statement) (mysqlproto.Verdict, bool) {
	notes := s.notes
	s.notes = nil
	if st.Command != mysql.COM_QUERY {
		return mysqlproto.Verdict{}, false
	}
	words := sqlscan.HeadWords(st.Query, st.Mode(), 8)
	switch strings.Join(words, " ") {
	case "SHOW WARNINGS":
		rows := make([][]string, len(notes))
		for i, n := range notes {
			rows[i] = []string{"Note", strconv.Itoa(int(n.Code)), n.Message}
		}
		return resultReply([]string{"Level", "Code", "Message"}, rows), true
	case "SHOW COUNT ( * ) WARNINGS":
		return resultReply([]string{"@@session.warning_count"}, [][]string{{strconv.Itoa(len(notes))}}), true
	}
	return mysqlproto.Verdict{}, false
}

// errNoAccount is MySQL's 1396 for ALTER USER of an account the backend
// does not have.
func errNoAccount(user, host string) *mysqlproto.Error {
	return &mysqlproto.Error{Code: mysql.ER_CANNOT_USER, State: "HY000",
		Message: fmt.Sprintf("Operation ALTER USER failed for '%s'@'%s'", user, host)}
}

// accountExists asks the backend, on the session's own connection (whose
// user has SUPER: it runs DDL), whether the account user@host exists.
// SHOW GRANTS FOR takes no hex literal, so the names are written between
// quotes as they are, with nothing to escape: a name holding a quote, a
// backslash or a control character is refused. What is left cannot end
// the string early in any character set: no multi-byte character of
// MariaDB's has a quote as its second byte.
func (s *session) accountExists(ctx context.Context, be mysqlproto.Backend, user, host string) (bool, error) {
	for _, name := range [2]string{user, host} {
		if strings.ContainsFunc(name, func(r rune) bool { return r == '\'' || r == '\\' || r < ' ' || r == 0x7f }) {
			return false, resourcegroup.NewInvalid("invalid binding: rgproxy binds no account whose user or host name " +
				"holds a quote, a backslash or a control character")
		}
	}
	s.cpu.stale()
	_, _, err := be.Query(ctx, "SHOW GRANTS FOR '"+user+"'@'"+host+"'")
	var me *mysqlproto.Error
	switch {
	case err == nil:
		return true, nil
	case asMySQLError(err, &me) && (me.Code == mysql.ER_NONEXISTING_GRANT || me.Code == mysql.ER_PASSWORD_NO_MATCH):
		// ER_NONEXISTING_GRANT, ER_PASSWORD_NO_MATCH: no such account.
		return false, nil
	}
	return false, fmt.Errorf("rgpolicy: asking whether the account exists: %w", err)
}

// showLast answers SHOW LAST STATEMENT RU: the session's previous
// statement, including one rgproxy refused (0 RU, its wait, 8252).
func (s *session) showLast() mysqlproto.Verdict {
	cols := []string{"RESOURCE_GROUP", "RRU", "WRU", "READ_BYTES", "WRITE_BYTES", "BACKEND_MS", "THROTTLE_WAIT_MS", "ERROR", "WOULD",
		"TAG_RESOURCE_GROUP", "ESTIMATED_RU", "WRU_SOURCE", "SHAPE_RESOURCE_GROUP"}
	if !s.last.valid {
		return resultReply(cols, nil)
	}
	c := s.last.cost
	extra, source := s.lastWrite() // waits briefly for a binary-log claim
	c.Add(extra)
	errCode := ""
	if s.last.errCode != 0 {
		errCode = strconv.Itoa(int(s.last.errCode))
	}
	return resultReply(cols, [][]string{{
		s.last.group,
		formatFloat(c.RRU), formatFloat(c.WRU),
		strconv.FormatFloat(c.ReadBytes, 'f', 0, 64), strconv.FormatFloat(c.WriteBytes, 'f', 0, 64),
		formatFloat(c.BackendSeconds * 1000), formatFloat(float64(s.last.waited) / float64(time.Millisecond)),
		errCode, s.last.would, s.last.tagGroup, formatFloat(s.last.estimate.RU()), source, s.last.shapeGroup,
	}})
}

// selectVirtual answers a query resourcegroup parsed on a virtual table:
// its columns cols (nil: all) of the rows the session may see, only the
// group name when byName.
func (s *session) selectVirtual(ctx context.Context, be mysqlproto.Backend, table string, cols []string, byName bool, name string) mysqlproto.Verdict {
	t, err := s.virtualTable(ctx, table, be)
	if err != nil {
		return errReply(err)
	}
	if byName {
		t.keepRows("NAME", func(g string) bool { return g == name })
	}
	if cols == nil {
		for _, c := range t.cols {
			cols = append(cols, c.name)
		}
	}
	idx := make([]int, len(cols))
	for i, c := range cols {
		if idx[i] = t.col(c); idx[i] < 0 {
			return errReply(resourcegroup.NewUnsupported("column " + c + " of information_schema." + table))
		}
	}
	rows := make([][]*string, 0, len(t.rows))
	for _, r := range t.rows {
		row := make([]*string, len(idx))
		for i, j := range idx {
			row[i] = r[j]
		}
		rows = append(rows, row)
	}
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Columns: cols, Rows: rows}}
}

// usageColumns are SHOW RESOURCE GROUP USAGE's columns.
var usageColumns = []string{"NAME", "RU_PER_SEC_LAST_10S", "TOKENS_LEFT", "THROTTLED", "DEGRADED", "CPU_SOURCE"}

// usageTable is SHOW RESOURCE GROUP USAGE's rows of the groups keep
// accepts (nil: every group), as a virtual table (its numbers numeric) and
// as text.
func (s *session) usageTable(keep func(string) bool) (*vtable, [][]string) {
	t := &vtable{}
	for i, c := range usageColumns {
		t.cols = append(t.cols, vcol{name: c, numeric: i >= 1 && i <= 3})
	}
	var rows [][]string
	cpu := s.p.cpu.inForce().String()
	for _, u := range s.p.tokens.Usage(s.p.clk.Now()) {
		if keep != nil && !keep(u.Group) {
			continue
		}
		row := usageRow(u, cpu)
		rows = append(rows, row)
		t.rows = append(t.rows, cellsOf(row))
	}
	return t, rows
}

// usageRow is one group's row of SHOW RESOURCE GROUP USAGE, as text.
func usageRow(u tokenclient.GroupUsage, cpu string) []string {
	return []string{u.Group, formatFloat(u.RUPerSec), formatFloat(u.Tokens),
		strconv.FormatUint(u.Throttled, 10), yesNo(u.Degraded), cpu}
}

// likeOnName turns SHOW ...'s "LIKE 'p'" into "WHERE NAME LIKE 'p'"; a
// WHERE clause stays as it is.
func likeOnName(filter string) string {
	if len(filter) >= 4 && strings.EqualFold(filter[:4], "LIKE") {
		return "WHERE `NAME` " + filter
	}
	return filter
}

// errAdminInMulti refuses an admin statement inside a multi-statement:
// rgproxy answers those itself, the backend would get the rest.
var errAdminInMulti = &mysqlproto.Error{Code: resourcegroup.CodeNotAllowedPrepare, State: "HY000",
	Message: "rgproxy: resource group statements must be sent alone, not inside a multi-statement"}

// multiHasAdmin reports whether any part of a multi-statement is one of
// rgproxy's admin statements.
func multiHasAdmin(q string, m sqlscan.Mode) bool {
	for _, part := range sqlscan.SplitStatements([]byte(q), m) {
		if resourcegroup.IsAdmin(string(part), m) {
			return true
		}
	}
	return false
}

// mysqlError converts an error of resourcegroup (or mysqlproto) into the
// MySQL error sent to the client; anything else is 1105.
func mysqlError(err error) *mysqlproto.Error {
	var re *resourcegroup.Error
	if errors.As(err, &re) {
		return &mysqlproto.Error{Code: re.Code, State: re.State, Message: re.Message}
	}
	var me *mysqlproto.Error
	if errors.As(err, &me) {
		return me
	}
	return rgproxyError(err.Error())
}

func asMySQLError(err error, me **mysqlproto.Error) bool { return errors.As(err, me) }

func errReply(err error) mysqlproto.Verdict {
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Err: mysqlError(err)}}
}

func resultReply(cols []string, rows [][]string) mysqlproto.Verdict {
	out := make([][]*string, len(rows))
	for i, r := range rows {
		out[i] = make([]*string, len(r))
		for j := range r {
			v := r[j]
			out[i][j] = &v
		}
	}
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Columns: cols, Rows: out}}
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

func yesNo(b bool) string {
	if b {
		return "YES"
	}
	return "NO"
}
