package resourcegroup

import (
	"strconv"
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
)

// String names a priority as SQL does.
func (p Priority) String() string {
	switch p {
	case PriorityLow:
		return "LOW"
	case PriorityMedium:
		return "MEDIUM"
	case PriorityHigh:
		return "HIGH"
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

// String names a burst mode as SQL does.
func (b BurstMode) String() string {
	switch b {
	case BurstOff:
		return "OFF"
	case BurstModerated:
		return "MODERATED"
	case BurstUnlimited:
		return "UNLIMITED"
	}
	return "BurstMode(" + strconv.Itoa(int(b)) + ")"
}

// String names a mode as SQL does.
func (m Mode) String() string {
	switch m {
	case ModeEnforce:
		return "ENFORCE"
	case ModeWarn:
		return "WARN"
	case ModeOff:
		return "OFF"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// String names an action as SQL does (without SWITCH_GROUP's target).
func (a Action) String() string {
	switch a {
	case ActionNone:
		return "NONE"
	case ActionDryRun:
		return "DRYRUN"
	case ActionCooldown:
		return "COOLDOWN"
	case ActionKill:
		return "KILL"
	case ActionSwitchGroup:
		return "SWITCH_GROUP"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// String names a watch type as SQL does.
func (w WatchType) String() string {
	switch w {
	case WatchNone:
		return "NONE"
	case WatchExact:
		return "EXACT"
	case WatchSimilar:
		return "SIMILAR"
	}
	return "WatchType(" + strconv.Itoa(int(w)) + ")"
}

// QuoteName backquotes a name for SQL, doubling backquotes inside it.
func QuoteName(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// ruText renders an RU_PER_SEC value.
func ruText(v uint64) string {
	if v == Unlimited {
		return "UNLIMITED"
	}
	return strconv.FormatUint(v, 10)
}

// SQL renders the SHOW CREATE RESOURCE GROUP text, e.g.
//
//	CREATE RESOURCE GROUP `rg1` RU_PER_SEC=500 PRIORITY=HIGH BURSTABLE=MODERATED QUERY_LIMIT=(EXEC_ELAPSED='1m0s', ACTION=KILL, WATCH=SIMILAR DURATION='10m0s') BUDGET=(RU=2000000 PER DAY, ON 80 PERCENT NOTIFY, ON 100 PERCENT THROTTLE(RU_PER_SEC=50))
//
// BURSTABLE is left out when OFF, as TiDB does. Parse(g.SQL()) yields g.
func (g Group) SQL() string {
	var b strings.Builder
	b.WriteString("CREATE RESOURCE GROUP ")
	b.WriteString(QuoteName(g.Name))
	b.WriteString(" RU_PER_SEC=")
	b.WriteString(ruText(g.RUPerSec))
	b.WriteString(" PRIORITY=")
	b.WriteString(g.Priority.String())
	if g.Burst != BurstOff {
		b.WriteString(" BURSTABLE=")
		b.WriteString(g.Burst.String())
	}
	if q := g.QueryLimit; q != nil {
		b.WriteString(" QUERY_LIMIT=(")
		b.WriteString(q.SQL())
		b.WriteString(")")
	}
	// rgproxy's extensions, when set, after TiDB's options.
	if g.Mode != ModeEnforce {
		b.WriteString(" MODE=")
		b.WriteString(g.Mode.String())
	}
	if g.MaxConcurrency > 0 {
		b.WriteString(" MAX_CONCURRENCY=" + strconv.FormatUint(g.MaxConcurrency, 10))
	}
	if len(g.Budgets) > 0 {
		b.WriteString(" ")
		b.WriteString(BudgetsSQL(g.Budgets))
	}
	if g.Parent != "" {
		b.WriteString(" PARENT=")
		b.WriteString(QuoteName(g.Parent))
	}
	if g.Background > 0 {
		b.WriteString(" BACKGROUND=(" + backgroundText(g.Background) + ")")
	}
	return b.String()
}

// identText leaves a name bare when it lexes as one word, as TiDB prints
// SWITCH_GROUP(rg2), and backquotes it otherwise.
func identText(name string) string {
	digits := true
	for i := 0; i < len(name); i++ {
		if !sqltext.IdentByte(name[i]) {
			return QuoteName(name)
		}
		if name[i] < '0' || name[i] > '9' {
			digits = false
		}
	}
	if digits {
		return QuoteName(name)
	}
	return name
}

// SQL renders the limit as the inside of QUERY_LIMIT=(...), the one text
// SHOW CREATE RESOURCE GROUP, information_schema.resource_groups and the
// console show: TiDB's information_schema form, e.g.
//
//	EXEC_ELAPSED='1m0s', ACTION=KILL, WATCH=SIMILAR DURATION='10m0s'
//
// Strings are single-quoted, so the text parses back under ANSI_QUOTES too.
func (q QueryLimit) SQL() string {
	var parts []string
	if q.ExecElapsed > 0 {
		parts = append(parts, "EXEC_ELAPSED='"+q.ExecElapsed.String()+"'")
	}
	if q.RU > 0 {
		parts = append(parts, "RU="+strconv.FormatUint(q.RU, 10))
	}
	parts = append(parts, "ACTION="+actionText(&q))
	if q.Watch != WatchNone {
		w := "WATCH=" + q.Watch.String() + " DURATION="
		if q.WatchDuration == 0 {
			w += "UNLIMITED"
		} else {
			w += "'" + q.WatchDuration.String() + "'"
		}
		parts = append(parts, w)
	}
	return strings.Join(parts, ", ")
}

// actionText renders ACTION's value, with SWITCH_GROUP's target.
func actionText(q *QueryLimit) string {
	if q.Action == ActionSwitchGroup {
		return "SWITCH_GROUP(" + identText(q.SwitchGroup) + ")"
	}
	return q.Action.String()
}

// InfoSchemaRow renders g as a row of information_schema.resource_groups,
// in InfoSchemaColumns' order; nil is SQL NULL. QUERY_LIMIT is
// QueryLimit.SQL, as in SHOW CREATE RESOURCE GROUP; BUDGETS is BudgetsSQL,
// the group's BUDGET clauses as SHOW CREATE writes them (NULL for none,
// as QUERY_LIMIT); PARENT the parent's name (NULL for none).
func InfoSchemaRow(g Group) []*string {
	str := func(s string) *string { return &s }
	row := []*string{
		str(g.Name),
		str(ruText(g.RUPerSec)),
		str(g.Priority.String()),
		str(g.Burst.String()),
		nil,
		nil, // BACKGROUND: NULL for a foreground group
		str(g.Mode.String()),
		nil, // MAX_CONCURRENCY: NULL when there is no cap
		nil, // BUDGETS: NULL when there is none
		nil, // PARENT: NULL when there is none
	}
	if g.Parent != "" {
		row[9] = str(g.Parent)
	}
	if g.Background > 0 {
		row[5] = str(backgroundText(g.Background))
	}
	if len(g.Budgets) > 0 {
		row[8] = str(BudgetsSQL(g.Budgets))
	}
	if g.MaxConcurrency > 0 {
		row[7] = str(strconv.FormatUint(g.MaxConcurrency, 10))
	}
	if q := g.QueryLimit; q != nil {
		row[4] = str(q.SQL())
	}
	return row
}

// backgroundText is BACKGROUND's inside, as SHOW CREATE and
// information_schema.resource_groups write it.
func backgroundText(pct uint8) string {
	return "UTILIZATION_LIMIT=" + strconv.Itoa(int(pct))
}
