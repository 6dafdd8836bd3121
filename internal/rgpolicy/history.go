package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/sqlscan"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// The runaway history, information_schema.runaway_queries (TiDB's
// mysql.tidb_runaway_queries): every runaway event of every proxy, kept
// by rgserver's leader (docs/design.md §7.9). The proxy records each
// event it sees — a statement that crossed its group's QUERY_LIMIT
// (MATCH_TYPE IDENTIFY) or matched a runaway watch (WATCH) — without
// waiting, and answers the table from rgserver's rows, filtered by the
// session's privileges like every virtual table.

// vtRunawayQueries is the history's virtual table.
const vtRunawayQueries = "runaway_queries"

// RunawayHistory records and reads the runaway history
// (tokenclient.Client). Safe for concurrent use.
type RunawayHistory interface {
	// RecordRunaway queues an event; it never blocks.
	RecordRunaway(tokenclient.RunawayEvent)
	// ListRunaways reads the history of groups (nil: every group).
	ListRunaways(ctx context.Context, groups []string) ([]tokenclient.RunawayRow, error)
}

// Errors of the history, as the client sees them.
var (
	errHistoryUnavailable = rgproxyError("rgproxy: information_schema.runaway_queries is kept by rgserver, which could not be reached (or named no leader) within 3 s; " +
		"rgproxy_runaway_total on each proxy's /metrics still counts runaway statements")
	errHistoryOff = rgproxyError("rgproxy: information_schema.runaway_queries needs rgserver; this proxy has no token client")
)

// runawayColumns are runaway_queries' columns.
var runawayColumns = []vcol{
	{name: "INSTANCE"}, {name: "RESOURCE_GROUP_NAME"}, {name: "START_TIME"}, {name: "LAST_TIME"},
	{name: "REPEATS", numeric: true}, {name: "MATCH_TYPE"}, {name: "ACTION"}, {name: "RULE"},
	{name: "SQL_DIGEST"}, {name: "SAMPLE_SQL"}, {name: "ACCOUNT"},
}

// account names the session's account in the history: user@host when
// the host is known, else the user.
func (s *session) account() string {
	if s.hostKnown {
		return s.user + "@" + s.host
	}
	return s.user
}

// learnAccountForHistory asks the backend, once per login, which account
// the session is when a statement of its group could make a runaway event
// (a QUERY_LIMIT, or any watch), so that the history's ACCOUNT is always
// user@host.
func (s *session) learnAccountForHistory(ctx context.Context, be mysqlproto.Backend) {
	if s.hostKnown || s.p.history == nil {
		return
	}
	exact, similar := s.p.tokens.HasWatches()
	if g, _ := s.group(s.cur.group); g.QueryLimit == nil && !exact && !similar {
		return
	}
	s.learnAccount(ctx, be)
}

// recordRunaway sends one event to the history, if there is one; it
// may run on a guard's timer goroutine, so it reads nothing of the
// session's that a statement changes.
func (s *session) recordRunaway(account, group, match, act, switchGroup, rule, query string, mode sqlscan.Mode, digest uint64) {
	h := s.p.history
	if h == nil {
		return
	}
	if act == resourcegroup.ActionSwitchGroup.String() {
		act += "(" + switchGroup + ")"
	}
	shown, masked := sqlscan.Sample(query, mode)
	h.RecordRunaway(tokenclient.RunawayEvent{Group: group, Time: s.p.clk.Now(), Account: account,
		Digest: fmt.Sprintf("%016x", digest), SampleSQL: shown, MaskedSQL: masked, MatchType: match, Action: act, Rule: rule})
}

// limitRule describes the QUERY_LIMIT a statement crossed.
func limitRule(q resourcegroup.QueryLimit) string {
	var parts []string
	if q.ExecElapsed > 0 {
		parts = append(parts, "EXEC_ELAPSED='"+q.ExecElapsed.String()+"'")
	}
	if q.RU > 0 {
		parts = append(parts, "RU="+strconv.FormatUint(q.RU, 10))
	}
	return strings.Join(parts, " ")
}

// watchRule describes the watch a statement matched.
func watchRule(w resourcegroup.Watch) string {
	return "WATCH=" + w.Match.String() + " ID=" + strconv.FormatUint(w.ID, 10)
}

// runawayTable builds runaway_queries as the session may see it: with
// SUPER every row, else the rows of the groups it may read, with
// SAMPLE_SQL as its digest text (literals replaced by ?, as read in the
// character set and sql_mode of the session that ran it) unless the
// statement was the session's own account's. The text is UTF-8, decoded
// from that session's character set.
func (s *session) runawayTable(ctx context.Context, be mysqlproto.Backend) (*vtable, error) {
	if s.p.history == nil {
		return nil, errHistoryOff
	}
	own, err := s.readableSet(ctx, be)
	if err != nil {
		return nil, err
	}
	var groups []string
	if own != nil {
		groups = make([]string, 0, len(own))
		for g := range own {
			groups = append(groups, g)
		}
		sort.Strings(groups)
		if len(groups) > maxPushedGroups {
			groups = nil
		}
	}
	rows, err := s.p.history.ListRunaways(ctx, groups)
	if err != nil {
		return nil, historyError(err)
	}
	if !s.hostKnown {
		s.learnAccount(ctx, be) // the rows name user@host
	}
	me := s.account()
	t := &vtable{cols: runawayColumns}
	ts := func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") }
	for _, r := range rows {
		if own != nil && !own[r.Group] {
			continue
		}
		sample := r.SampleSQL
		if own != nil && r.Account != me {
			// Masked as the session that ran it read it; a row without
			// (an older proxy's) is masked in every mode.
			if sample = r.MaskedSQL; sample == "" {
				sample = sqlscan.Mask(r.SampleSQL)
			}
		}
		row := []string{r.Instance, r.Group, ts(r.Start), ts(r.Last),
			strconv.FormatUint(r.Repeats, 10), r.MatchType, r.Action, r.Rule, r.Digest, sample, r.Account}
		t.rows = append(t.rows, cellsOf(row))
	}
	return t, nil
}

// historyError is what a statement answers when the history could not be
// read: readable MySQL text, never gRPC's.
func historyError(err error) error {
	switch {
	case errors.Is(err, tokenclient.ErrUnavailable),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errHistoryUnavailable
	}
	return rgproxyError("rgproxy: runaway history: " + err.Error())
}
