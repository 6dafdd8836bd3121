package rgpolicy

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// rgproxy's virtual tables live in information_schema, but rgproxy, not
// the backend, holds their rows. A statement that names one is rewritten:
// each reference becomes a derived table built from the proxy's data,
// CURRENT_RESOURCE_GROUP() becomes the statement's group as a string, and
// the statement goes to the backend, whose SQL engine evaluates WHERE,
// LIKE, IN, ORDER BY, LIMIT, aggregates, aliases and joins with real
// tables exactly as for any table. Rows are filtered by privilege before
// the rewrite: a user sees only what it may see.
//
// No value reaches the backend as quoted text: every string — group
// names, tag keys and values, account names, statement, digest and watch
// texts — is written as a hex literal of its UTF-8 bytes with the utf8mb4
// introducer (sqlText), which the backend's lexer reads the same in every
// character set and SQL mode; numbers are written only once checked to be
// numbers (sqlNumber).

// Virtual table names, lower case.
const (
	vtResourceGroups    = "resource_groups"
	vtRunawayWatches    = "runaway_watches"
	vtStatementsSummary = "statements_summary"
	vtBindings          = "resource_group_bindings"
	// The cluster-wide views (cluster.go).
	vtClusterSummary = "cluster_statements_summary"
	vtClusterUsage   = "cluster_resource_group_usage"
)

// isVirtualTable reports whether name (any case) is a virtual table.
func isVirtualTable(name string) bool {
	switch strings.ToLower(name) {
	case vtResourceGroups, vtRunawayWatches, vtStatementsSummary, vtBindings, vtClusterSummary, vtClusterUsage,
		vtRunawayQueries, vtSummaryHistory, vtUsageHistory, vtBudgets, vtUsageByTag, vtUsageByAccount:
		return true
	}
	return false
}

// vcol is a column of a virtual table; numeric columns are rendered as
// numbers, so that they compare and sort as numbers.
type vcol struct {
	name    string
	numeric bool
}

// vtable is a virtual table's content; a nil value is SQL NULL.
type vtable struct {
	cols []vcol
	rows [][]*string
}

// virtualRef is one span of the text to replace.
type virtualRef = sqlscan.TableRef

// currentGroupFunc is the function rgproxy answers itself.
const currentGroupFunc = "current_resource_group"

// findVirtual returns the references to virtual tables and to
// CURRENT_RESOURCE_GROUP() in q (sqlscan.TableRefs).
func findVirtual(q string, mode sqlscan.Mode, inDB func() bool) []virtualRef {
	return sqlscan.TableRefs(q, mode, isVirtualTable, currentGroupFunc, inDB)
}

// rewriteVirtual replaces refs in q: each table by a derived table from
// table(name), CURRENT_RESOURCE_GROUP() by current. The session's
// NO_BACKSLASH_ESCAPES does not matter to what it writes.
func rewriteVirtual(q string, _ bool, refs []virtualRef, current string, table func(name string) (*vtable, error)) (string, error) {
	var b strings.Builder
	b.Grow(len(q) + 256)
	built := map[string]string{}
	last := 0
	for _, r := range refs {
		b.WriteString(q[last:r.Start])
		last = r.End
		switch {
		case r.Table == "":
			b.WriteString(sqlText(current))
			if r.SelectItem {
				b.WriteString(" AS ")
				b.WriteString(functionAlias(q[r.Start:r.End]))
			}
		case r.Column:
			b.WriteString(quoteIdent(r.Table))
		default:
			sub, ok := built[r.Table]
			if !ok {
				t, err := table(r.Table)
				if err != nil {
					return "", fmt.Errorf("rgpolicy: %s: %w", r.Table, err)
				}
				sub = derivedTable(t)
				built[r.Table] = sub
			}
			b.WriteString(sub)
			if !r.Alias {
				b.WriteString(" AS ")
				b.WriteString(quoteIdent(r.Table))
			}
		}
	}
	b.WriteString(q[last:])
	return b.String(), nil
}

// derivedTable renders t as "(SELECT ... UNION ALL SELECT ...)": the first
// SELECT names the columns; an empty table is one typed row filtered out.
func derivedTable(t *vtable) string {
	var b strings.Builder
	b.WriteString("(")
	if len(t.rows) == 0 {
		b.WriteString("SELECT ")
		for i, c := range t.cols {
			if i > 0 {
				b.WriteString(", ")
			}
			if c.numeric {
				b.WriteString("CAST(NULL AS DECIMAL(65,6))")
			} else {
				b.WriteString(sqlText("")) // coercible, as the rows' texts
			}
			b.WriteString(" AS ")
			b.WriteString(quoteIdent(c.name))
		}
		b.WriteString(" FROM DUAL WHERE FALSE)")
		return b.String()
	}
	for r, row := range t.rows {
		if r > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString("SELECT ")
		for i, c := range t.cols {
			if i > 0 {
				b.WriteString(", ")
			}
			var v *string
			if i < len(row) {
				v = row[i]
			}
			switch {
			case v == nil:
				b.WriteString("NULL")
			case c.numeric:
				b.WriteString(sqlNumber(*v))
			default:
				b.WriteString(sqlText(*v))
			}
			if r == 0 {
				b.WriteString(" AS ")
				b.WriteString(quoteIdent(c.name))
			}
		}
	}
	b.WriteString(")")
	return b.String()
}

// sqlText renders s as a string literal that needs no escaping: the hex
// literal of its UTF-8 bytes with the utf8mb4 introducer. No byte of s
// reaches the backend's lexer, so no character set (gbk, big5, sjis,
// cp932, whose multi-byte characters can swallow an escaping backslash)
// and no SQL mode changes where it ends. The literal is coercible, as a
// quoted string is, so it compares and joins with columns of any
// collation that can hold its characters. Bytes that are not UTF-8
// (a statement sent in another character set) become U+FFFD.
func sqlText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	b.Grow(len("_utf8mb4 X''") + 2*len(s))
	b.WriteString("_utf8mb4 X'")
	b.WriteString(hex.EncodeToString([]byte(s)))
	b.WriteString("'")
	return b.String()
}

// sqlNumber renders a numeric cell: an optional '-', digits and at most
// one '.' with digits on both sides, written as they are; anything else
// (NaN, Inf, an exponent, text) is NULL.
func sqlNumber(s string) string {
	digits, dot := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '-' && i == 0:
		case c == '.' && !dot && digits > 0 && i+1 < len(s):
			dot = true
		default:
			return "NULL"
		}
	}
	if digits == 0 {
		return "NULL"
	}
	return s
}

// quoteIdent backquotes one of rgproxy's own names (a virtual table's or a
// column's); never a user's.
func quoteIdent(s string) string { return "`" + s + "`" }

// functionAlias names the column of a bare CURRENT_RESOURCE_GROUP() select
// item as the client wrote it, as MySQL does, when that text is only
// letters, '_', parentheses and spaces; else (a comment inside) as
// CURRENT_RESOURCE_GROUP(). Nothing is escaped.
func functionAlias(text string) string { return quoteIdent(functionColumn(text)) }

// functionColumn is functionAlias unquoted.
func functionColumn(text string) string {
	for i := 0; i < len(text); i++ {
		c := text[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '(' || c == ')' || c == ' ') {
			return "CURRENT_RESOURCE_GROUP()"
		}
	}
	return text
}

// askedGroup reports whether st, whose references to rgproxy's names are
// refs, is SELECT CURRENT_RESOURCE_GROUP() alone (a hint and comments
// allowed, no alias), which rgproxy answers itself, and returns the
// column's name.
func askedGroup(st *mysqlproto.Statement, refs []virtualRef) (string, bool) {
	if len(refs) != 1 || refs[0].Table != "" || !refs[0].SelectItem || st.Command != mysql.COM_QUERY || st.Multi {
		return "", false
	}
	stmt, err := resourcegroup.Parse(st.Query, st.Mode())
	if _, ok := stmt.(*resourcegroup.CurrentGroup); !ok || err != nil {
		return "", false
	}
	return functionColumn(st.Query[refs[0].Start:refs[0].End]), true
}

// virtualTable builds a virtual table's rows as the session may see them:
// with SUPER every row; else only the rows of the groups it may read
// (readableGroups), and in runaway_watches the digest of an EXACT watch's
// text instead of the text, whose literals are another user's.
func (s *session) virtualTable(ctx context.Context, name string, be mysqlproto.Backend) (*vtable, error) {
	readable, err := s.readableGroups(ctx, be)
	if err != nil {
		return nil, err
	}
	switch name {
	case vtResourceGroups:
		t, err := resultTable(resourcegroup.Execute(ctx, &resourcegroup.SelectGroups{}, s.p.tokens.Store()))
		if err != nil {
			return nil, fmt.Errorf("rgpolicy: reading the groups: %w", err)
		}
		t.keepRows("NAME", readable)
		return t, nil
	case vtRunawayWatches:
		t, err := resultTable(resourcegroup.Execute(ctx, &resourcegroup.SelectWatches{}, s.p.tokens.Store()))
		if err != nil {
			return nil, fmt.Errorf("rgpolicy: reading the runaway watches: %w", err)
		}
		t.cols[0].numeric = true // ID
		t.keepRows("RESOURCE_GROUP_NAME", readable)
		if readable != nil {
			t.maskWatchText()
		}
		return t, nil
	case vtStatementsSummary:
		return s.summaryTable(readable), nil
	case vtSummaryHistory:
		return s.summaryHistoryTable(readable), nil
	case vtBindings:
		return s.bindingsTable(ctx, be)
	case vtClusterSummary, vtClusterUsage:
		return s.clusterTable(ctx, be, name)
	case vtRunawayQueries:
		return s.runawayTable(ctx, be)
	case vtUsageHistory:
		return s.usageHistoryTable(ctx, be)
	case vtBudgets:
		return s.budgetsTable(ctx, be)
	case vtUsageByTag, vtUsageByAccount:
		return s.chargebackTable(ctx, be, name == vtUsageByAccount)
	}
	return nil, resourcegroup.NewUnsupported("information_schema." + name)
}

// readableGroups returns which groups' rows a session without SUPER may
// read in the virtual tables, SHOW RESOURCE GROUP USAGE and SHOW CREATE
// RESOURCE GROUP: the groups it may use — its account's (default when it
// is bound to none), its current one (SET RESOURCE GROUP), and every group
// a tag or a digest is bound to (whoever sends the tag or the statement
// shape runs there; README asks to bind tags only to groups every user
// may use). With SUPER it returns nil: every group.
func (s *session) readableGroups(ctx context.Context, be mysqlproto.Backend) (func(string) bool, error) {
	own, err := s.readableSet(ctx, be)
	if own == nil || err != nil {
		return nil, err
	}
	return func(g string) bool { return own[g] }, nil
}

// readableSet is readableGroups as a set; nil with SUPER (every group).
func (s *session) readableSet(ctx context.Context, be mysqlproto.Backend) (map[string]bool, error) {
	if s.hasSuper(ctx, be) {
		return nil, nil
	}
	own := map[string]bool{s.bound(): true, s.currentGroup(): true}
	if s.p.tokens.HasTagBindings() || s.p.tokens.HasDigestBindings() {
		bs, err := s.p.tokens.Store().ListBindings(ctx)
		if err != nil {
			return nil, fmt.Errorf("rgpolicy: reading the tag and digest bindings: %w", err)
		}
		for _, b := range bs {
			if !b.IsAccount() {
				own[b.Group] = true
			}
		}
	}
	return own, nil
}

func resultTable(res *resourcegroup.Result, err error) (*vtable, error) {
	if err != nil {
		return nil, err
	}
	t := &vtable{rows: res.Rows}
	for _, c := range res.Columns {
		t.cols = append(t.cols, vcol{name: c})
	}
	return t, nil
}

// col returns the index of column name, or -1.
func (t *vtable) col(name string) int {
	for i, c := range t.cols {
		if c.name == name {
			return i
		}
	}
	return -1
}

// keepRows keeps the rows whose column col names a group keep accepts;
// nil keeps every row.
func (t *vtable) keepRows(col string, keep func(string) bool) {
	if keep == nil {
		return
	}
	i := t.col(col)
	rows := t.rows[:0]
	for _, r := range t.rows {
		if i >= 0 && i < len(r) && r[i] != nil && keep(*r[i]) {
			rows = append(rows, r)
		}
	}
	t.rows = rows
}

// maskWatchText replaces the WATCH_TEXT of runaway_watches' rows by its
// digest (literals replaced by ?) read in every mode a session may have
// written it in (a watch keeps its text as the proxy received it, to
// match it, without the mode): an EXACT row's is a statement's text with
// its literals, a SIMILAR row's a digest written in its session's mode,
// which under ANSI_QUOTES may show one.
func (t *vtable) maskWatchText() {
	text := t.col("WATCH_TEXT")
	if text < 0 {
		return
	}
	for _, r := range t.rows {
		if r[text] != nil {
			d := strings.ToValidUTF8(sqlscan.Mask(*r[text]), "\uFFFD")
			r[text] = &d
		}
	}
}

// bindingsTable is information_schema.resource_group_bindings: account
// bindings (USER, HOST), tag bindings (TAG_KEY, TAG_VALUE) and digest
// bindings (DIGEST), the other columns NULL. With SUPER every one, else
// the session's own account's and every tag and digest binding: whoever
// sends a tag or a bound statement shape gets its group, so those are no
// secret (a digest is a hash, not the statement's text).
func (s *session) bindingsTable(ctx context.Context, be mysqlproto.Backend) (*vtable, error) {
	bs, err := s.p.tokens.Store().ListBindings(ctx)
	if err != nil {
		return nil, fmt.Errorf("rgpolicy: reading the bindings: %w", err)
	}
	super := s.hasSuper(ctx, be)
	t := &vtable{cols: []vcol{{name: "USER"}, {name: "HOST"}, {name: "RESOURCE_GROUP"}, {name: "TAG_KEY"}, {name: "TAG_VALUE"}, {name: "DIGEST"}}}
	for _, b := range bs {
		if b.IsDigest() {
			row := []string{b.Group, b.Digest}
			t.rows = append(t.rows, []*string{nil, nil, &row[0], nil, nil, &row[1]})
			continue
		}
		if b.IsTag() {
			row := []string{b.Group, b.TagKey, b.TagValue}
			t.rows = append(t.rows, []*string{nil, nil, &row[0], &row[1], &row[2], nil})
			continue
		}
		if !super && (b.User != s.user || !s.hostKnown || b.Host != s.host) {
			continue
		}
		row := []string{b.User, b.Host, b.Group}
		t.rows = append(t.rows, []*string{&row[0], &row[1], &row[2], nil, nil, nil})
	}
	return t, nil
}

// summaryColumns are statements_summary's columns: TiDB's names where
// they apply (latencies and queued times in nanoseconds, as TiDB), then
// rgproxy's own.
var summaryColumns = []vcol{
	{name: "RESOURCE_GROUP"}, {name: "DIGEST"}, {name: "DIGEST_TEXT"},
	{name: "EXEC_COUNT", numeric: true}, {name: "SUM_LATENCY", numeric: true},
	{name: "AVG_LATENCY", numeric: true}, {name: "MAX_LATENCY", numeric: true},
	{name: "AVG_REQUEST_UNIT_READ", numeric: true}, {name: "MAX_REQUEST_UNIT_READ", numeric: true},
	{name: "AVG_REQUEST_UNIT_WRITE", numeric: true}, {name: "MAX_REQUEST_UNIT_WRITE", numeric: true},
	{name: "AVG_QUEUED_RC_TIME", numeric: true}, {name: "MAX_QUEUED_RC_TIME", numeric: true},
	{name: "SUM_ERRORS", numeric: true}, {name: "FIRST_SEEN"}, {name: "LAST_SEEN"},
	{name: "ESTIMATED_REQUEST_UNIT", numeric: true},
}

// summaryTable is statements_summary as the session may see it: the
// shapes of the groups keep accepts (nil: every group).
func (s *session) summaryTable(keep func(string) bool) *vtable {
	t := &vtable{cols: summaryColumns}
	for _, r := range s.p.shapes.summary(keep) {
		t.rows = append(t.rows, cellsOf(summaryRow(r)))
	}
	return t
}

// summaryRow is one shape's row of statements_summary, as text.
func summaryRow(r ShapeSummary) []string {
	ns := func(d time.Duration) string { return strconv.FormatInt(int64(d), 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return []string{r.Group, r.Digest, r.DigestText, u(r.ExecCount), ns(r.SumLatency), ns(r.AvgLatency()),
		ns(r.MaxLatency), f(r.AvgRRU), f(r.MaxRRU), f(r.AvgWRU), f(r.MaxWRU), ns(r.AvgQueued), ns(r.MaxQueued),
		u(r.SumErrors), summaryTime(r.FirstSeen), summaryTime(r.LastSeen), f(r.EstimateRU)}
}

// summaryTime is a time as the summary tables show it (UTC).
func summaryTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") }

// cellsOf is a row of text as a virtual table's cells (none NULL).
func cellsOf(row []string) []*string {
	cells := make([]*string, len(row))
	for i := range row {
		cells[i] = &row[i]
	}
	return cells
}

// virtualMentions is the Scan.Mentions bits of the words that may name a
// virtual table or CURRENT_RESOURCE_GROUP().
var virtualMentions = func() uint64 {
	var m uint64
	for i, w := range ScanWords() {
		switch w {
		case "current_resource_group", vtResourceGroups, vtRunawayWatches, vtStatementsSummary, vtBindings,
			vtClusterSummary, vtClusterUsage, vtRunawayQueries, vtSummaryHistory, vtUsageHistory, vtBudgets,
			vtUsageByTag, vtUsageByAccount:
			m |= 1 << i
		}
	}
	return m
}()

// inInformationSchema asks the backend whether the session's current
// database is information_schema.
func inInformationSchema(ctx context.Context, be mysqlproto.Backend) bool {
	_, rows, err := be.Query(ctx, "SELECT DATABASE()")
	return err == nil && len(rows) == 1 && len(rows[0]) == 1 && rows[0][0] != nil &&
		strings.EqualFold(*rows[0][0], "information_schema")
}
