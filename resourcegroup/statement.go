package resourcegroup

import "strings"

// Statement is one parsed admin statement; a type switch on the pointer
// types below tells them apart.
type Statement interface{ statement() }

// Field is a bit set of the options an ALTER RESOURCE GROUP names.
type Field uint16

// Options of CREATE/ALTER RESOURCE GROUP.
const (
	FieldRUPerSec Field = 1 << iota
	FieldPriority
	FieldBurst
	FieldQueryLimit
	FieldMode
	FieldMaxConcurrency
	// FieldBudget: one or more BUDGET clauses (AlterGroup.Budgets says
	// what they do).
	FieldBudget
	// FieldParent: PARENT = name or PARENT = NULL (Options.Parent "").
	FieldParent
	// FieldBackground: BACKGROUND = (UTILIZATION_LIMIT = n) or
	// BACKGROUND = NULL (Options.Background 0).
	FieldBackground
)

// CreateGroup is CREATE RESOURCE GROUP [IF NOT EXISTS] name options.
type CreateGroup struct {
	IfNotExists bool
	// Group is the definition; options not given keep their zero defaults
	// (PRIORITY=MEDIUM, BURSTABLE=OFF, no QUERY_LIMIT).
	Group Group
}

// AlterGroup is ALTER RESOURCE GROUP [IF EXISTS] name options: an
// incremental change of the fields in Fields, with values from Options.
// FieldQueryLimit with a nil Options.QueryLimit is QUERY_LIMIT = NULL.
// With FieldBudget, Budgets says which budgets change; Options.Budgets
// holds the ones set.
type AlterGroup struct {
	IfExists bool
	Name     string
	Fields   Field
	Options  Group
	Budgets  BudgetChange
}

// BudgetChange is what an ALTER's BUDGET clauses do besides setting the
// budgets in Options.Budgets, each of which replaces the group's budget
// of its period and keeps the others.
type BudgetChange struct {
	// Clear: BUDGET = NULL removes every budget (and is the statement's
	// only BUDGET clause).
	Clear bool
	// Drop are the periods of BUDGET PER <period> = NULL, whose budgets
	// are removed.
	Drop []BudgetPeriod
}

// Apply returns g with the change applied; g itself is not modified.
func (a *AlterGroup) Apply(g Group) Group {
	g = g.Clone()
	if a.Fields&FieldRUPerSec != 0 {
		g.RUPerSec = a.Options.RUPerSec
	}
	if a.Fields&FieldPriority != 0 {
		g.Priority = a.Options.Priority
	}
	if a.Fields&FieldBurst != 0 {
		g.Burst = a.Options.Burst
	}
	if a.Fields&FieldMode != 0 {
		g.Mode = a.Options.Mode
	}
	if a.Fields&FieldMaxConcurrency != 0 {
		g.MaxConcurrency = a.Options.MaxConcurrency
	}
	if a.Fields&FieldParent != 0 {
		g.Parent = a.Options.Parent
	}
	if a.Fields&FieldBackground != 0 {
		g.Background = a.Options.Background
	}
	if a.Fields&FieldQueryLimit != 0 {
		g.QueryLimit = nil
		if a.Options.QueryLimit != nil {
			q := *a.Options.QueryLimit
			g.QueryLimit = &q
		}
	}
	if a.Fields&FieldBudget != 0 {
		g.Budgets = a.applyBudgets(g.Budgets)
	}
	return g
}

// applyBudgets returns old (the group's budgets, already a copy) with the
// statement's BUDGET clauses applied, in period order; nil when none is
// left.
func (a *AlterGroup) applyBudgets(old []Budget) []Budget {
	var by [NumBudgetPeriods + 1]*Budget
	if !a.Budgets.Clear {
		for i := range old {
			if p := old[i].Period; p >= PeriodHour && p <= PeriodMonth {
				by[p] = &old[i]
			}
		}
	}
	for _, p := range a.Budgets.Drop {
		if p >= PeriodHour && p <= PeriodMonth {
			by[p] = nil
		}
	}
	set := cloneBudgets(a.Options.Budgets)
	for i := range set {
		if p := set[i].Period; p >= PeriodHour && p <= PeriodMonth {
			by[p] = &set[i]
		}
	}
	var out []Budget
	for _, b := range by {
		if b != nil {
			out = append(out, *b)
		}
	}
	return out
}

// DropGroup is DROP RESOURCE GROUP [IF EXISTS] name.
type DropGroup struct {
	IfExists bool
	Name     string
}

// AlterUserGroup is ALTER USER [IF EXISTS] user[@host] RESOURCE GROUP name.
// Group is DefaultGroup for `default` or “ (unbinding).
type AlterUserGroup struct {
	IfExists bool
	User     string
	// Host is "%" when the statement names none.
	Host  string
	Group string
}

// CreateTagBinding is CREATE RESOURCE GROUP BINDING FOR TAG key = 'value'
// TO group (an rgproxy extension): statements carrying the SQLCommenter
// tag key='value' run in group. It creates the binding or replaces the
// tag's binding to another group.
type CreateTagBinding struct {
	// Key and Value are the tag, decoded (no URL encoding).
	Key, Value string
	Group      string
}

// DropTagBinding is DROP RESOURCE GROUP BINDING [IF EXISTS] FOR TAG key =
// 'value'.
type DropTagBinding struct {
	IfExists   bool
	Key, Value string
}

// CreateDigestBinding is CREATE RESOURCE GROUP BINDING FOR DIGEST 'hex' TO
// group (an rgproxy extension): statements of that shape — their digest
// as statements_summary's DIGEST column shows it — run in group, text and
// prepared statements alike. It creates the binding or replaces the
// digest's binding to another group.
type CreateDigestBinding struct {
	// Digest is 16 hex digits, lower case.
	Digest string
	Group  string
}

// DropDigestBinding is DROP RESOURCE GROUP BINDING [IF EXISTS] FOR DIGEST
// 'hex'.
type DropDigestBinding struct {
	IfExists bool
	Digest   string
}

// StmtBinding is TiDB's statement binding, as far as rgproxy takes it:
// CREATE [GLOBAL] BINDING [FOR stmt] USING stmt, whose USING statement
// carries /*+ RESOURCE_GROUP(g) */, and DROP [GLOBAL] BINDING FOR stmt
// [USING stmt]. The parser does not read the statements: Text is what
// follows FOR (or, without FOR, the USING and what follows it), and
// Usings are the [start, end) offsets in Text of each USING keyword
// outside strings, comments and quoted names — one of them separates the
// two statements (another may belong to a JOIN ... USING (col)). The
// policy tries each split, digests both sides and takes the one where
// they are the same shape (Splits). It becomes a CreateDigestBinding or
// DropDigestBinding of the FOR statement's digest.
type StmtBinding struct {
	Create bool
	// HasFor: the statement names FOR; else (CREATE only) Text starts
	// with USING and the one statement is both.
	HasFor bool
	Text   string
	Usings [][2]int
}

// Split is one way to read a StmtBinding: the FOR statement and the USING
// statement ("" for a DROP without USING).
type Split struct{ For, Using string }

// Splits returns the ways b may be read, the first USING first; for a
// DROP, the whole text as the FOR statement last.
func (b *StmtBinding) Splits() []Split {
	if !b.HasFor {
		if len(b.Usings) == 0 || b.Usings[0][0] != 0 {
			return nil
		}
		s := strings.TrimSpace(b.Text[b.Usings[0][1]:])
		return []Split{{For: s, Using: s}}
	}
	var out []Split
	for _, u := range b.Usings {
		out = append(out, Split{For: strings.TrimSpace(b.Text[:u[0]]), Using: strings.TrimSpace(b.Text[u[1]:])})
	}
	if !b.Create {
		// DROP without USING; last, as a USING of a JOIN is no split.
		out = append(out, Split{For: strings.TrimSpace(b.Text)})
	}
	return out
}

// SetGroup is SET RESOURCE GROUP name (executed by the proxy session).
type SetGroup struct{ Name string }

// CurrentGroup is SELECT CURRENT_RESOURCE_GROUP() (executed by the proxy session).
type CurrentGroup struct{}

// ShowCreateGroup is SHOW CREATE RESOURCE GROUP name.
type ShowCreateGroup struct{ Name string }

// SelectGroups is SELECT cols FROM information_schema.resource_groups
// [WHERE NAME = 'x'].
type SelectGroups struct {
	// Columns are the requested columns in InfoSchemaColumns' spelling;
	// `*` expands to all of them.
	Columns []string
	// Name filters on one group when HasWhere.
	Name     string
	HasWhere bool
}

// ShowUsage is SHOW [CLUSTER] RESOURCE GROUP USAGE [LIKE 'pattern' |
// WHERE expr] (executed by the proxy). Filter is the LIKE or WHERE clause
// as written, "" when there is none; its SQL is the backend's to
// evaluate. Cluster: every proxy's usage, gathered through rgserver.
type ShowUsage struct {
	Filter  string
	Cluster bool
}

// ShowLastStatementRU is SHOW LAST STATEMENT RU (executed by the proxy session).
type ShowLastStatementRU struct{}

func (*CreateGroup) statement()         {}
func (*AlterGroup) statement()          {}
func (*DropGroup) statement()           {}
func (*AlterUserGroup) statement()      {}
func (*CreateTagBinding) statement()    {}
func (*DropTagBinding) statement()      {}
func (*CreateDigestBinding) statement() {}
func (*DropDigestBinding) statement()   {}
func (*StmtBinding) statement()         {}
func (*SetGroup) statement()            {}
func (*CurrentGroup) statement()        {}
func (*ShowCreateGroup) statement()     {}
func (*SelectGroups) statement()        {}
func (*ShowUsage) statement()           {}
func (*ShowLastStatementRU) statement() {}

// IsSessionBound reports whether st is executed by the proxy session (it
// reads or changes session state) rather than by Execute.
func IsSessionBound(st Statement) bool {
	switch st.(type) {
	case *SetGroup, *CurrentGroup, *ShowUsage, *ShowLastStatementRU:
		return true
	}
	return false
}

// RequiresSuper reports whether st changes groups or bindings, which needs
// SUPER. Strict-mode checks of SET RESOURCE GROUP and the hint are the
// caller's business.
func RequiresSuper(st Statement) bool {
	switch st.(type) {
	case *CreateGroup, *AlterGroup, *DropGroup, *AlterUserGroup, *CreateTagBinding, *DropTagBinding,
		*CreateDigestBinding, *DropDigestBinding, *StmtBinding, *QueryWatchAdd, *QueryWatchRemove, *AlterServiceLimit:
		return true
	}
	return false
}
