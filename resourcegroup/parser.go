package resourcegroup

// The parser is a small recursive-descent parser, over sqltext's tokens, for
// exactly the admin statements rgproxy owns (TiDB's resource-group syntax
// plus rgproxy's own SHOW statements). TiDB's parser package speaks the same
// grammar but pulls a large dependency tree into a build that runs on two
// cores, and does not know rgproxy's additions. Only statements that pass
// IsAdmin reach it, so it is off the per-statement hot path.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/sqltext"
)

// infoSchemaColumns are the columns of information_schema.resource_groups,
// in TiDB's order.
var infoSchemaColumns = [...]string{"NAME", "RU_PER_SEC", "PRIORITY", "BURSTABLE", "QUERY_LIMIT", "BACKGROUND",
	"MODE", "MAX_CONCURRENCY", "BUDGETS", "PARENT"} // the last four are rgproxy's

// InfoSchemaColumns returns the columns of information_schema.resource_groups.
func InfoSchemaColumns() []string {
	out := infoSchemaColumns
	return out[:]
}

// selectShape is the message of 1235 for an unsupported query shape.
const selectShape = "this query on information_schema.resource_groups; use SELECT * | NAME, RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT, BACKGROUND, MODE, MAX_CONCURRENCY, BUDGETS, PARENT FROM information_schema.resource_groups [WHERE NAME = '...']"

// watchesShape is the message of 1235 for other queries on runaway_watches.
const watchesShape = "this query on information_schema.runaway_watches; use SELECT * FROM information_schema.runaway_watches"

// parser holds one token of look-ahead.
type parser struct {
	lex lexer
	tok token
	// budgets is what the BUDGET clauses of the options being read
	// remove (options resets it); the budgets set go in the Group.
	budgets BudgetChange
}

// Parse parses one admin statement. Errors are *Error: 1064 with the
// position, 1105 for invalid values (TiDB's wording), 1235 for shapes
// rgproxy does not implement, 1295 for more than one statement.
//
// m is the session's mode (Statement.Mode in mysqlproto): the statement is
// read in its character set and NO_BACKSLASH_ESCAPES, as the server would
// read it.
func Parse(sql string, m sqltext.Mode) (Statement, error) {
	p := &parser{lex: newLexer(sql, m)}
	if err := p.advance(); err != nil {
		return nil, err
	}
	st, err := p.statement()
	if err != nil {
		return nil, err
	}
	if p.isPunct(";") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if p.tok.kind != tkEOF {
			return nil, NewNotAllowedInPrepare()
		}
	}
	if p.tok.kind != tkEOF {
		return nil, p.failWhy("expected the end of the statement, not %s")
	}
	return st, nil
}

func (p *parser) advance() error {
	t, err := p.lex.next()
	if err != nil {
		return err
	}
	p.tok = t
	return nil
}

func (p *parser) fail() error { return NewSyntax(p.lex.src, p.tok.pos) }

// failWhy is a syntax error at the current token saying why; "%s" in why
// stands for the token (tokText).
func (p *parser) failWhy(why string) error {
	return NewSyntaxWhy(p.lex.src, p.tok.pos, strings.ReplaceAll(why, "%s", p.tokText()))
}

// tokText names the current token in a syntax error: 'text', or "the end
// of the statement".
func (p *parser) tokText() string {
	if p.tok.kind == tkEOF || p.isPunct(";") {
		return "the end of the statement"
	}
	t := p.tok.text
	const max = 40
	if len(t) > max {
		t = t[:max] + "..."
	}
	return "'" + strings.ToValidUTF8(t, "?") + "'"
}

// atEnd: nothing but an optional ";" is left.
func (p *parser) atEnd() bool { return p.tok.kind == tkEOF || p.isPunct(";") }

// groupOptions names the options of CREATE/ALTER RESOURCE GROUP, for
// syntax errors.
const groupOptions = "RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT, MODE, MAX_CONCURRENCY, BUDGET, PARENT, BACKGROUND"

// limitOptions names the options inside QUERY_LIMIT = (...).
const limitOptions = "EXEC_ELAPSED, RU, ACTION, WATCH, DURATION"

func (p *parser) isWord(kw string) bool {
	return p.tok.kind == tkWord && eqFold(p.tok.text, kw)
}

func (p *parser) isPunct(c string) bool { return p.tok.kind == tkPunct && p.tok.text == c }

// expectWords consumes the keywords kws in order.
func (p *parser) expectWords(kws ...string) error {
	for _, kw := range kws {
		if !p.isWord(kw) {
			return p.failWhy("expected " + kw + ", not %s")
		}
		if err := p.advance(); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) expectPunct(c string) error {
	if !p.isPunct(c) {
		return p.failWhy("expected '" + c + "', not %s")
	}
	return p.advance()
}

// acceptPunct consumes c if it is next.
func (p *parser) acceptPunct(c string) (bool, error) {
	if !p.isPunct(c) {
		return false, nil
	}
	return true, p.advance()
}

// optionalEq consumes an optional "=", which TiDB allows after option names.
func (p *parser) optionalEq() error {
	_, err := p.acceptPunct("=")
	return err
}

func (p *parser) statement() (Statement, error) {
	switch {
	case (p.isWord("CREATE") || p.isWord("DROP")) && p.stmtBindingAhead():
		return p.stmtBinding()
	case p.isWord("CREATE"):
		return p.create()
	case p.isWord("ALTER"):
		if err := p.advance(); err != nil {
			return nil, err
		}
		if p.isWord("USER") {
			return p.alterUser()
		}
		if p.resourceControlAhead() {
			return p.alterServiceLimit()
		}
		return p.alterGroup()
	case p.isWord("DROP"):
		return p.drop()
	case p.isWord("SET"):
		if err := p.advance(); err != nil {
			return nil, err
		}
		if err := p.expectWords("RESOURCE", "GROUP"); err != nil {
			return nil, err
		}
		name, err := p.groupName()
		if err != nil {
			return nil, err
		}
		return &SetGroup{Name: name}, nil
	case p.isWord("SHOW"):
		return p.show()
	case p.isWord("SELECT"):
		return p.selectStmt()
	case p.isWord("QUERY"):
		return p.queryWatch()
	case p.isWord("EXPLAIN"):
		return p.explain()
	case p.isWord("CALIBRATE"):
		return p.calibrate()
	}
	return nil, p.fail()
}

// stmtBindingAhead reports whether CREATE or DROP goes on with [GLOBAL |
// SESSION] BINDING: TiDB's statement binding. The parser is left where it
// was.
func (p *parser) stmtBindingAhead() bool {
	save := *p
	defer func() { *p = save }()
	if p.advance() != nil {
		return false
	}
	if p.isWord("GLOBAL") || p.isWord("SESSION") {
		if p.advance() != nil {
			return false
		}
	}
	return p.isWord("BINDING")
}

// stmtBinding parses TiDB's CREATE [GLOBAL] BINDING [FOR stmt] USING
// stmt, DROP [GLOBAL] BINDING FOR stmt [USING stmt] and DROP [GLOBAL]
// BINDING FOR SQL DIGEST 'hex' (StmtBinding). SESSION bindings are 1235:
// rgproxy keeps bindings in rgserver, for every session.
func (p *parser) stmtBinding() (Statement, error) {
	create := p.isWord("CREATE")
	if err := p.advance(); err != nil {
		return nil, err
	}
	if p.isWord("SESSION") {
		return nil, NewUnsupported("SESSION bindings; rgproxy's bindings are GLOBAL (kept by rgserver for every session)")
	}
	if p.isWord("GLOBAL") {
		if err := p.advance(); err != nil {
			return nil, err
		}
	}
	if err := p.expectWords("BINDING"); err != nil {
		return nil, err
	}
	st := &StmtBinding{Create: create}
	switch {
	case p.isWord("FOR"):
		st.HasFor = true
		if err := p.advance(); err != nil {
			return nil, err
		}
		if !create && p.isWord("SQL") {
			save := *p
			if err := p.advance(); err != nil {
				return nil, err
			}
			if p.isWord("DIGEST") {
				if err := p.advance(); err != nil {
					return nil, err
				}
				d, err := p.digest()
				if err != nil {
					return nil, err
				}
				return &DropDigestBinding{Digest: d}, nil
			}
			*p = save
		}
	case create && p.isWord("USING"):
	case create:
		return nil, p.failWhy("expected FOR or USING, not %s")
	default:
		return nil, p.failWhy("expected FOR, not %s")
	}
	start := p.tok.pos
	end := start
	for p.tok.kind != tkEOF && !p.isPunct(";") {
		if p.tok.kind == tkWord && eqFold(p.tok.text, "USING") {
			st.Usings = append(st.Usings, [2]int{p.tok.pos - start, p.lex.l.Pos() - start})
		}
		end = p.lex.l.Pos()
		if err := p.advance(); err != nil {
			return nil, err
		}
	}
	st.Text = p.lex.src[start:end]
	switch {
	case st.Text == "" || st.HasFor && len(st.Usings) > 0 && st.Usings[0][0] == 0:
		return nil, p.failWhy("expected a statement after FOR, not %s")
	case create && len(st.Usings) == 0:
		return nil, p.failWhy("CREATE BINDING needs USING and a statement carrying /*+ RESOURCE_GROUP(g) */, not %s")
	}
	return st, nil
}

// groupName reads the name (bare or backquoted) of an existing group and
// normalizes it; ValidateName checks it.
func (p *parser) groupName() (string, error) { return p.name(ValidateName) }

// newGroupName reads the name of a group being created; ValidateNewName
// checks it.
func (p *parser) newGroupName() (string, error) { return p.name(ValidateNewName) }

func (p *parser) name(validate func(string) error) (string, error) {
	if p.tok.kind != tkWord && p.tok.kind != tkQIdent {
		if p.tok.kind == tkString {
			return "", p.failWhy("expected a resource group name, not the string %s: quote a name with backquotes (`)")
		}
		return "", p.failWhy("expected a resource group name, not %s")
	}
	name := NormalizeName(p.tok.text)
	if err := validate(name); err != nil {
		return "", err
	}
	return name, p.advance()
}

func (p *parser) ifExists() (bool, error) {
	if !p.isWord("IF") {
		return false, nil
	}
	if err := p.advance(); err != nil {
		return false, err
	}
	return true, p.expectWords("EXISTS")
}

func (p *parser) create() (Statement, error) {
	if err := p.expectWords("CREATE", "RESOURCE", "GROUP"); err != nil {
		return nil, err
	}
	if p.bindingAhead(false) {
		return p.createBinding()
	}
	st := &CreateGroup{}
	if p.isWord("IF") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if err := p.expectWords("NOT", "EXISTS"); err != nil {
			return nil, err
		}
		st.IfNotExists = true
	}
	name, err := p.newGroupName()
	if err != nil {
		return nil, err
	}
	g, fields, err := p.options()
	if err != nil {
		return nil, err
	}
	if fields == 0 {
		// TiDB's grammar needs at least one option.
		if p.atEnd() {
			return nil, p.failWhy("CREATE RESOURCE GROUP needs at least one option (" + groupOptions + ") after " + QuoteName(name) + ", e.g. RU_PER_SEC = 500")
		}
		return nil, p.failOption()
	}
	if !p.atEnd() {
		return nil, p.failOption()
	}
	g.Name = name
	if err := g.ValidateNew(); err != nil {
		return nil, err
	}
	st.Group = g
	return st, nil
}

func (p *parser) alterGroup() (Statement, error) {
	if err := p.expectWords("RESOURCE", "GROUP"); err != nil {
		return nil, err
	}
	st := &AlterGroup{}
	var err error
	if st.IfExists, err = p.ifExists(); err != nil {
		return nil, err
	}
	if st.Name, err = p.groupName(); err != nil {
		return nil, err
	}
	if st.Options, st.Fields, err = p.options(); err != nil {
		return nil, err
	}
	if st.Fields == 0 && p.atEnd() {
		return nil, p.failWhy("ALTER RESOURCE GROUP needs at least one option (" + groupOptions + ") after " + QuoteName(st.Name))
	}
	if st.Fields == 0 || !p.atEnd() {
		return nil, p.failOption()
	}
	st.Options.Name = st.Name
	st.Budgets = p.budgets
	if q := st.Options.QueryLimit; q != nil {
		if err := q.validate(st.Name); err != nil {
			return nil, err
		}
	}
	return st, nil
}

func (p *parser) drop() (Statement, error) {
	if err := p.expectWords("DROP", "RESOURCE", "GROUP"); err != nil {
		return nil, err
	}
	if p.bindingAhead(true) {
		return p.dropBinding()
	}
	st := &DropGroup{}
	var err error
	if st.IfExists, err = p.ifExists(); err != nil {
		return nil, err
	}
	if st.Name, err = p.groupName(); err != nil {
		return nil, err
	}
	return st, nil
}

// bindingAhead reports whether the statement goes on with a tag or
// digest binding: the bare word BINDING followed by FOR (or, for DROP, by
// IF). Anything else — `CREATE RESOURCE GROUP binding RU_PER_SEC = 1` —
// names a group. The parser is left where it was.
func (p *parser) bindingAhead(ifExists bool) bool {
	if !p.isWord("BINDING") {
		return false
	}
	save := *p
	defer func() { *p = save }()
	if p.advance() != nil {
		return false // the group path reports the lexical error
	}
	return p.isWord("FOR") || ifExists && p.isWord("IF")
}

// forDigest reads FOR and looks at the next word: true for DIGEST
// (consumed), false for anything else (left for tag, which expects TAG).
func (p *parser) forDigest() (bool, error) {
	if err := p.expectWords("FOR"); err != nil {
		return false, err
	}
	if !p.isWord("DIGEST") {
		if !p.isWord("TAG") {
			return false, p.failWhy("expected TAG or DIGEST, not %s")
		}
		return false, nil
	}
	return true, p.advance()
}

// createBinding parses BINDING FOR TAG key = 'value' TO group or BINDING
// FOR DIGEST 'hex' TO group.
func (p *parser) createBinding() (Statement, error) {
	if err := p.expectWords("BINDING"); err != nil {
		return nil, err
	}
	isDigest, err := p.forDigest()
	if err != nil {
		return nil, err
	}
	var st Statement
	if isDigest {
		d, err := p.digest()
		if err != nil {
			return nil, err
		}
		st = &CreateDigestBinding{Digest: d}
	} else {
		key, value, err := p.tag()
		if err != nil {
			return nil, err
		}
		if err := ValidateNewTag(key, value); err != nil {
			return nil, err
		}
		st = &CreateTagBinding{Key: key, Value: value}
	}
	if err := p.expectWords("TO"); err != nil {
		return nil, err
	}
	group, err := p.groupName()
	if err != nil {
		return nil, err
	}
	switch st := st.(type) {
	case *CreateDigestBinding:
		st.Group = group
	case *CreateTagBinding:
		st.Group = group
	}
	return st, nil
}

// dropBinding parses BINDING [IF EXISTS] FOR TAG key = 'value' or BINDING
// [IF EXISTS] FOR DIGEST 'hex'.
func (p *parser) dropBinding() (Statement, error) {
	if err := p.expectWords("BINDING"); err != nil {
		return nil, err
	}
	ifExists, err := p.ifExists()
	if err != nil {
		return nil, err
	}
	isDigest, err := p.forDigest()
	if err != nil {
		return nil, err
	}
	if isDigest {
		d, err := p.digest()
		if err != nil {
			return nil, err
		}
		return &DropDigestBinding{IfExists: ifExists, Digest: d}, nil
	}
	st := &DropTagBinding{IfExists: ifExists}
	if st.Key, st.Value, err = p.tag(); err != nil {
		return nil, err
	}
	return st, nil
}

// digest parses a digest binding's 'hex': a quoted string of
// DigestLength hex digits (ValidateDigest), returned in lower case.
func (p *parser) digest() (string, error) {
	if p.tok.kind != tkString {
		return "", p.failWhy("expected the digest as a quoted string of 16 hex digits (statements_summary's DIGEST), not %s")
	}
	d := p.tok.text
	if err := ValidateDigest(d); err != nil {
		return "", err
	}
	return NormalizeDigest(d), p.advance()
}

// tag parses TAG key = 'value' (after FOR): the key an identifier (bare
// or backquoted) or a quoted string, the value a quoted string, both as
// the application sends them once decoded (no URL encoding).
func (p *parser) tag() (key, value string, err error) {
	if err := p.expectWords("TAG"); err != nil {
		return "", "", err
	}
	if p.tok.kind != tkWord && p.tok.kind != tkQIdent && p.tok.kind != tkString {
		return "", "", p.fail()
	}
	key = p.tok.text
	if err := p.advance(); err != nil {
		return "", "", err
	}
	if err := p.expectPunct("="); err != nil {
		return "", "", err
	}
	if p.tok.kind != tkString {
		return "", "", p.fail()
	}
	value = p.tok.text
	if err := ValidateTag(key, value); err != nil {
		return "", "", err
	}
	return key, value, p.advance()
}

// alterUser parses ALTER USER [IF EXISTS] user[@host] RESOURCE GROUP name.
func (p *parser) alterUser() (Statement, error) {
	if err := p.expectWords("USER"); err != nil {
		return nil, err
	}
	st := &AlterUserGroup{Host: "%"}
	var err error
	if st.IfExists, err = p.ifExists(); err != nil {
		return nil, err
	}
	if p.tok.kind != tkWord && p.tok.kind != tkQIdent && p.tok.kind != tkString {
		return nil, p.fail()
	}
	st.User = p.tok.text
	if err := p.advance(); err != nil {
		return nil, err
	}
	switch {
	case p.tok.kind == tkVar && !strings.HasPrefix(p.tok.text, "@@"):
		// user@host and user@'host' lex as a user variable: the host
		// is what follows the '@'.
		rest := p.tok.text[1:]
		if rest != "" && (rest[0] == '\'' || rest[0] == '"' || rest[0] == '`') {
			h, ok := sqltext.Unquote(rest, p.lex.mode)
			if !ok {
				return nil, p.fail()
			}
			st.Host = h
		} else if st.Host = p.lex.host(p.tok.pos + 1).text; badHost(st.Host) {
			return nil, p.fail()
		}
		if err := p.advance(); err != nil {
			return nil, err
		}
	case p.isPunct("@"):
		if err := p.advance(); err != nil {
			return nil, err
		}
		switch p.tok.kind {
		case tkQIdent, tkString:
			st.Host = p.tok.text
		case tkWord, tkNumber, tkOther:
			st.Host = p.lex.host(p.tok.pos).text // an IP address is one name
		default:
			return nil, p.fail()
		}
		if badHost(st.Host) {
			return nil, p.fail()
		}
		if err := p.advance(); err != nil {
			return nil, err
		}
	}
	if err := p.expectWords("RESOURCE", "GROUP"); err != nil {
		return nil, err
	}
	if p.tok.kind == tkQIdent && p.tok.text == "" {
		// TiDB takes RESOURCE GROUP `` as default.
		st.Group = DefaultGroup
		return st, p.advance()
	}
	if st.Group, err = p.groupName(); err != nil {
		return nil, err
	}
	return st, nil
}

func (p *parser) show() (Statement, error) {
	if err := p.expectWords("SHOW"); err != nil {
		return nil, err
	}
	switch {
	case p.isWord("CREATE"):
		if err := p.expectWords("CREATE", "RESOURCE", "GROUP"); err != nil {
			return nil, err
		}
		name, err := p.groupName()
		if err != nil {
			return nil, err
		}
		return &ShowCreateGroup{Name: name}, nil
	case p.resourceControlAhead():
		if err := p.expectWords("RESOURCE", "CONTROL"); err != nil {
			return nil, err
		}
		return &ShowResourceControl{}, nil
	case p.isWord("RESOURCE"), p.isWord("CLUSTER"):
		cluster := p.isWord("CLUSTER")
		if cluster {
			if err := p.advance(); err != nil {
				return nil, err
			}
		}
		if err := p.expectWords("RESOURCE", "GROUP", "USAGE"); err != nil {
			return nil, err
		}
		if p.isWord("LIKE") || p.isWord("WHERE") {
			// The rest is SQL for the backend: taken whole, as written.
			filter := strings.TrimRight(strings.TrimSpace(p.lex.src[p.tok.pos:]), "; \t\r\n")
			p.tok = token{kind: tkEOF, pos: len(p.lex.src)}
			return &ShowUsage{Filter: filter, Cluster: cluster}, nil
		}
		return &ShowUsage{Cluster: cluster}, nil
	case p.isWord("LAST"):
		if err := p.expectWords("LAST", "STATEMENT", "RU"); err != nil {
			return nil, err
		}
		return &ShowLastStatementRU{}, nil
	}
	return nil, p.fail()
}

// resourceControlAhead reports whether the tokens ahead are RESOURCE
// CONTROL (not RESOURCE GROUP).
func (p *parser) resourceControlAhead() bool {
	if !p.isWord("RESOURCE") {
		return false
	}
	save := *p
	defer func() { *p = save }()
	return p.advance() == nil && p.isWord("CONTROL")
}

// alterServiceLimit parses RESOURCE CONTROL SERVICE LIMIT [=] n | UNLIMITED.
func (p *parser) alterServiceLimit() (Statement, error) {
	if err := p.expectWords("RESOURCE", "CONTROL"); err != nil {
		return nil, err
	}
	if !p.isWord("SERVICE") {
		return nil, p.failWhy("ALTER RESOURCE CONTROL sets SERVICE LIMIT = n | UNLIMITED, not %s")
	}
	if err := p.expectWords("SERVICE", "LIMIT"); err != nil {
		return nil, err
	}
	if err := p.optionalEq(); err != nil {
		return nil, err
	}
	v, err := p.ruValue("SERVICE LIMIT", true)
	if err != nil {
		return nil, err
	}
	if v == Unlimited {
		v = 0
	}
	return &AlterServiceLimit{RUPerSec: v}, nil
}

// selectStmt parses SELECT CURRENT_RESOURCE_GROUP() and the supported
// queries on information_schema.resource_groups and runaway_watches.
// Anything else that mentions those tables is 1235.
func (p *parser) selectStmt() (Statement, error) {
	if err := p.expectWords("SELECT"); err != nil {
		return nil, err
	}
	if p.isWord("CURRENT_RESOURCE_GROUP") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if err := p.expectPunct("("); err != nil {
			return nil, err
		}
		if err := p.expectPunct(")"); err != nil {
			return nil, err
		}
		if p.tok.kind != tkEOF && !p.isPunct(";") {
			return nil, NewUnsupported("CURRENT_RESOURCE_GROUP() in a larger query; use SELECT CURRENT_RESOURCE_GROUP() alone")
		}
		return &CurrentGroup{}, nil
	}
	// The select list: * or plain column names, kept as tokens until the
	// table is known.
	var cols []token
	star, err := p.acceptPunct("*")
	if err != nil {
		return nil, err
	}
	for !star {
		if p.tok.kind != tkWord && p.tok.kind != tkQIdent || p.isWord("FROM") {
			return nil, NewUnsupported(selectShape)
		}
		cols = append(cols, p.tok)
		if err := p.advance(); err != nil {
			return nil, err
		}
		if ok, err := p.acceptPunct(","); err != nil {
			return nil, err
		} else if !ok {
			break
		}
	}
	if !p.isWord("FROM") {
		return nil, NewUnsupported(selectShape)
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	if !p.isIdent("information_schema") {
		return nil, NewUnsupported(selectShape)
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	if !p.isPunct(".") {
		return nil, NewUnsupported(selectShape)
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	if p.isIdent("runaway_watches") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if !star || p.tok.kind != tkEOF && !p.isPunct(";") {
			return nil, NewUnsupported(watchesShape)
		}
		return &SelectWatches{}, nil
	}
	if !p.isIdent("resource_groups") {
		return nil, NewUnsupported(selectShape)
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	st := &SelectGroups{}
	if star {
		st.Columns = InfoSchemaColumns()
	}
	for _, c := range cols {
		name, ok := infoColumn(c)
		if !ok {
			return nil, NewUnsupported(selectShape)
		}
		st.Columns = append(st.Columns, name)
	}
	if p.isWord("WHERE") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if !p.isIdent("NAME") {
			return nil, NewUnsupported(selectShape)
		}
		if err := p.advance(); err != nil {
			return nil, err
		}
		if !p.isPunct("=") {
			return nil, NewUnsupported(selectShape)
		}
		if err := p.advance(); err != nil {
			return nil, err
		}
		if p.tok.kind != tkString {
			return nil, NewUnsupported(selectShape)
		}
		st.Name, st.HasWhere = NormalizeName(p.tok.text), true
		if err := p.advance(); err != nil {
			return nil, err
		}
	}
	if p.tok.kind != tkEOF && !p.isPunct(";") {
		return nil, NewUnsupported(selectShape)
	}
	return st, nil
}

// badHost reports whether an unquoted host name is empty or has an empty
// label ("10.", ".x", "a..b").
func badHost(h string) bool {
	return h == "" || h[0] == '.' || h[len(h)-1] == '.' || strings.Contains(h, "..")
}

// isIdent reports whether the token is the identifier name, bare or quoted.
func (p *parser) isIdent(name string) bool {
	return (p.tok.kind == tkWord || p.tok.kind == tkQIdent) && eqFold(p.tok.text, name)
}

// infoColumn maps a token to an information_schema.resource_groups column.
func infoColumn(t token) (string, bool) {
	for _, c := range infoSchemaColumns {
		if eqFold(t.text, c) {
			return c, true
		}
	}
	return "", false
}

// options parses the option list of CREATE/ALTER RESOURCE GROUP, separated
// by spaces or commas. A repeated option is a syntax error, as in TiDB.
func (p *parser) options() (Group, Field, error) {
	var g Group
	var fields Field
	p.budgets = BudgetChange{}
	for {
		var f Field
		start := p.tok
		switch {
		case p.isWord("RU_PER_SEC"):
			f = FieldRUPerSec
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			if err := p.optionalEq(); err != nil {
				return g, 0, err
			}
			v, err := p.ruValue("RU_PER_SEC", true)
			if err != nil {
				return g, 0, err
			}
			g.RUPerSec = v
		case p.isWord("PRIORITY"):
			f = FieldPriority
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			if err := p.optionalEq(); err != nil {
				return g, 0, err
			}
			switch {
			case p.isWord("LOW"):
				g.Priority = PriorityLow
			case p.isWord("MEDIUM"):
				g.Priority = PriorityMedium
			case p.isWord("HIGH"):
				g.Priority = PriorityHigh
			default:
				return g, 0, p.failWhy("PRIORITY is LOW, MEDIUM or HIGH, not %s")
			}
			if err := p.advance(); err != nil {
				return g, 0, err
			}
		case p.isWord("BURSTABLE"):
			f = FieldBurst
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			g.Burst = BurstModerated
			eq, err := p.acceptPunct("=")
			if err != nil {
				return g, 0, err
			}
			if mode, ok := p.burstValue(); ok {
				g.Burst = mode
				if err := p.advance(); err != nil {
					return g, 0, err
				}
			} else if eq {
				return g, 0, p.failWhy("BURSTABLE is MODERATED, UNLIMITED or OFF (or BURSTABLE alone), not %s")
			}
		case p.isWord("QUERY_LIMIT"):
			f = FieldQueryLimit
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			if err := p.optionalEq(); err != nil {
				return g, 0, err
			}
			q, err := p.queryLimit()
			if err != nil {
				return g, 0, err
			}
			g.QueryLimit = q
		case p.isWord("MODE"):
			f = FieldMode
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			if err := p.optionalEq(); err != nil {
				return g, 0, err
			}
			switch {
			case p.isWord("ENFORCE"):
				g.Mode = ModeEnforce
			case p.isWord("WARN"):
				g.Mode = ModeWarn
			case p.isWord("OFF"):
				g.Mode = ModeOff
			default:
				return g, 0, p.failWhy("MODE is ENFORCE, WARN or OFF, not %s")
			}
			if err := p.advance(); err != nil {
				return g, 0, err
			}
		case p.isWord("MAX_CONCURRENCY"):
			f = FieldMaxConcurrency
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			if err := p.optionalEq(); err != nil {
				return g, 0, err
			}
			switch {
			case p.isWord("NULL"), p.isWord("UNLIMITED"):
				g.MaxConcurrency = 0
			case p.tok.kind == tkNumber:
				v, err := strconv.ParseUint(p.tok.text, 10, 64)
				if err != nil || v > MaxConcurrencyCap {
					return g, 0, errMaxConcurrency(p.tok.text)
				}
				g.MaxConcurrency = v // 0 = no cap
			default:
				return g, 0, p.failWhy("MAX_CONCURRENCY is a whole number or NULL, not %s")
			}
			if err := p.advance(); err != nil {
				return g, 0, err
			}
		case p.isWord("PARENT"):
			f = FieldParent
			if err := p.advance(); err != nil {
				return g, 0, err
			}
			if err := p.optionalEq(); err != nil {
				return g, 0, err
			}
			if p.isWord("NULL") { // detach; a group named null is `null`
				g.Parent = ""
				if err := p.advance(); err != nil {
					return g, 0, err
				}
				break
			}
			name, err := p.groupName()
			if err != nil {
				return g, 0, err
			}
			g.Parent = name
		case p.isWord("BUDGET"):
			// Repeatable: one clause per period (budgetClause refuses
			// a period given twice).
			f = FieldBudget
			if err := p.budgetClause(&g, start); err != nil {
				return g, 0, err
			}
		case p.isWord("BACKGROUND"):
			f = FieldBackground
			if err := p.backgroundClause(&g); err != nil {
				return g, 0, err
			}
		case p.isWord("CPU"), p.isWord("IO_READ_BANDWIDTH"), p.isWord("IO_WRITE_BANDWIDTH"):
			return g, 0, NewUnsupported(strings.ToUpper(p.tok.text) + " (raw resource mode)")
		default:
			return g, fields, nil
		}
		if fields&f != 0 && f != FieldBudget {
			return g, 0, NewSyntaxWhy(p.lex.src, start.pos, strings.ToUpper(start.text)+" is given twice")
		}
		fields |= f
		if _, err := p.acceptPunct(","); err != nil {
			return g, 0, err
		}
	}
}

// failOption is the syntax error of a token where a group option should
// be.
func (p *parser) failOption() error {
	if p.tok.kind == tkWord {
		return p.failWhy("unknown option %s; the options are " + groupOptions)
	}
	return p.failWhy("expected an option (" + groupOptions + "), not %s")
}

// burstValue maps the current token to a BURSTABLE mode.
func (p *parser) burstValue() (BurstMode, bool) {
	switch {
	case p.isWord("MODERATED"), p.isWord("TRUE"):
		return BurstModerated, true
	case p.isWord("UNLIMITED"):
		return BurstUnlimited, true
	case p.isWord("OFF"), p.isWord("FALSE"):
		return BurstOff, true
	}
	return 0, false
}

// ruValue reads the RU amount of option field: an integer from 1 to
// MaxRU or, when unlimited is allowed, UNLIMITED.
func (p *parser) ruValue(field string, unlimited bool) (uint64, error) {
	switch {
	case unlimited && p.isWord("UNLIMITED"):
		return Unlimited, p.advance()
	case p.tok.kind == tkNumber:
		v, err := strconv.ParseUint(p.tok.text, 10, 64)
		if err != nil || v == 0 || v > MaxRU {
			return 0, errRU(field, p.tok.text, unlimited)
		}
		return v, p.advance()
	case p.isPunct("-"):
		// A negative amount: say so rather than a bare syntax error.
		save := *p
		if err := p.advance(); err == nil && p.tok.kind == tkNumber {
			return 0, errRU(field, "-"+p.tok.text, unlimited)
		}
		*p = save
	}
	what := field + " is a whole number"
	if unlimited {
		what += " or UNLIMITED"
	}
	if p.tok.kind == tkString {
		return 0, p.failWhy(what + " without quotes, not %s")
	}
	return 0, p.failWhy(what + ", not %s")
}

// queryLimit parses NULL or ( runaway options ).
func (p *parser) queryLimit() (*QueryLimit, error) {
	if p.isWord("NULL") {
		return nil, p.advance()
	}
	if !p.isPunct("(") {
		return nil, p.failWhy("QUERY_LIMIT is NULL or (EXEC_ELAPSED = '60s' | RU = n, ACTION = ... [, WATCH = ... DURATION = ...]), not %s")
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	if ok, err := p.acceptPunct(")"); err != nil || ok {
		// QUERY_LIMIT=() also removes the limit, as in TiDB.
		return nil, err
	}
	q := &QueryLimit{}
	const (
		seenElapsed = 1 << iota
		seenRU
		seenAction
		seenWatch
		seenDuration
	)
	seen := 0
	for !p.isPunct(")") {
		start := p.tok
		var this int
		switch {
		case p.isWord("EXEC_ELAPSED"):
			this = seenElapsed
			if err := p.advance(); err != nil {
				return nil, err
			}
			if err := p.optionalEq(); err != nil {
				return nil, err
			}
			d, err := p.duration(msgInvalidElapsed, "EXEC_ELAPSED", MaxExecElapsed, false)
			if err != nil {
				return nil, err
			}
			q.ExecElapsed = d
		case p.isWord("RU"):
			this = seenRU
			if err := p.advance(); err != nil {
				return nil, err
			}
			if err := p.optionalEq(); err != nil {
				return nil, err
			}
			v, err := p.ruValue("QUERY_LIMIT RU", false)
			if err != nil {
				return nil, err
			}
			q.RU = v
		case p.isWord("PROCESSED_KEYS"):
			return nil, NewUnsupported("QUERY_LIMIT PROCESSED_KEYS")
		case p.isWord("ACTION"):
			this = seenAction
			if err := p.advance(); err != nil {
				return nil, err
			}
			if err := p.optionalEq(); err != nil {
				return nil, err
			}
			if err := p.action(q); err != nil {
				return nil, err
			}
		case p.isWord("WATCH"):
			this = seenWatch
			if err := p.advance(); err != nil {
				return nil, err
			}
			if err := p.optionalEq(); err != nil {
				return nil, err
			}
			switch {
			case p.isWord("EXACT"):
				q.Watch = WatchExact
			case p.isWord("SIMILAR"):
				q.Watch = WatchSimilar
			case p.isWord("PLAN"):
				return nil, NewUnsupported("WATCH = PLAN")
			default:
				return nil, p.failWhy("WATCH is EXACT or SIMILAR, not %s")
			}
			if err := p.advance(); err != nil {
				return nil, err
			}
		case p.isWord("DURATION"):
			this = seenDuration
			if err := p.advance(); err != nil {
				return nil, err
			}
			if err := p.optionalEq(); err != nil {
				return nil, err
			}
			d, err := p.duration(msgInvalidWatch, "DURATION", MaxWatchDuration, true)
			if err != nil {
				return nil, err
			}
			q.WatchDuration = d
		default:
			if p.tok.kind == tkWord {
				return nil, p.failWhy("unknown QUERY_LIMIT option %s; its options are " + limitOptions)
			}
			if p.atEnd() {
				return nil, p.failWhy("QUERY_LIMIT's ( is not closed")
			}
			return nil, p.failWhy("expected a QUERY_LIMIT option (" + limitOptions + ") or ')', not %s")
		}
		if seen&this != 0 {
			return nil, NewSyntaxWhy(p.lex.src, start.pos, "QUERY_LIMIT's "+strings.ToUpper(start.text)+" is given twice")
		}
		seen |= this
		if _, err := p.acceptPunct(","); err != nil {
			return nil, err
		}
	}
	if err := p.advance(); err != nil {
		return nil, err
	}
	if seen&seenDuration != 0 && seen&seenWatch == 0 {
		return nil, NewInvalid(msgInvalidWatch + ": DURATION needs WATCH")
	}
	return q, nil
}

// duration reads the quoted Go duration ('60s', "10m") of option field,
// 1ms to max in whole milliseconds; UNLIMITED (0) is allowed when
// unlimited is set. Errors are 1105 starting with msg, naming the field
// and its range.
func (p *parser) duration(msg, field string, max time.Duration, unlimited bool) (time.Duration, error) {
	if unlimited && p.isWord("UNLIMITED") {
		return 0, p.advance()
	}
	if p.tok.kind != tkString {
		u := ""
		if unlimited {
			u = " or UNLIMITED"
		}
		return 0, p.failWhy(field + " is a quoted duration such as '60s' or '10m'" + u + ", not %s")
	}
	d, err := time.ParseDuration(p.tok.text)
	if err != nil {
		return 0, NewInvalid(fmt.Sprintf("%s: %s = '%s' is not a duration such as '60s' or '10m'; %s",
			msg, field, p.tok.text, durationRange(field, max, unlimited)))
	}
	if err := checkDuration(msg, field, p.tok.text, d, max, unlimited); err != nil {
		return 0, err
	}
	return d, p.advance()
}

// action parses DRYRUN | COOLDOWN | KILL | SWITCH_GROUP(name) into q.
func (p *parser) action(q *QueryLimit) error {
	switch {
	case p.isWord("DRYRUN"):
		q.Action = ActionDryRun
	case p.isWord("COOLDOWN"):
		q.Action = ActionCooldown
	case p.isWord("KILL"):
		q.Action = ActionKill
	case p.isWord("SWITCH_GROUP"):
		q.Action = ActionSwitchGroup
		if err := p.advance(); err != nil {
			return err
		}
		if err := p.expectPunct("("); err != nil {
			return err
		}
		name, err := p.groupName()
		if err != nil {
			return err
		}
		q.SwitchGroup = name
		return p.expectPunct(")")
	default:
		return p.failWhy("ACTION is DRYRUN, COOLDOWN, KILL or SWITCH_GROUP(group), not %s")
	}
	return p.advance()
}

// budgetSyntax is the BUDGET clause's grammar, for syntax errors.
const budgetSyntax = "BUDGET = (RU = n PER HOUR|DAY|WEEK|MONTH [, ON p PERCENT NOTIFY|THROTTLE(RU_PER_SEC = r)|REFUSE]...), " +
	"BUDGET PER HOUR|DAY|WEEK|MONTH = NULL or BUDGET = NULL"

// budgetClause parses one BUDGET clause, from the word BUDGET (start):
//
//	BUDGET [=] (RU [=] n PER period [[,] ON p PERCENT action]...)  -- sets period's budget
//	BUDGET PER period = NULL                                      -- removes it
//	BUDGET [=] NULL                                               -- removes every budget
//
// A budget set goes into g.Budgets in period order, a removal into
// p.budgets. A period named twice, or BUDGET = NULL beside another BUDGET
// clause, is a syntax error; a budget without a trigger gets ON 100
// PERCENT NOTIFY. Each budget is validated on its own here; against the
// group's RU_PER_SEC by Group.Validate.
func (p *parser) budgetClause(g *Group, start token) error {
	if err := p.advance(); err != nil {
		return err
	}
	if p.budgets.Clear {
		return NewSyntaxWhy(p.lex.src, start.pos, "BUDGET = NULL removes every budget; it cannot go with another BUDGET clause")
	}
	if p.isWord("PER") {
		period, err := p.budgetPeriod()
		if err != nil {
			return err
		}
		if err := p.expectPunct("="); err != nil {
			return err
		}
		if !p.isWord("NULL") {
			return p.failWhy("BUDGET PER " + period.String() + " = NULL removes the group's " + period.String() +
				" budget; to set one write BUDGET = (RU = n PER " + period.String() + " ...), not BUDGET PER " + period.String() + " = %s")
		}
		if p.budgetGiven(g, period) {
			return NewSyntaxWhy(p.lex.src, start.pos, "BUDGET PER "+period.String()+" is given twice")
		}
		p.budgets.Drop = append(p.budgets.Drop, period)
		return p.advance()
	}
	if err := p.optionalEq(); err != nil {
		return err
	}
	if p.isWord("NULL") {
		if len(g.Budgets) > 0 || len(p.budgets.Drop) > 0 {
			return NewSyntaxWhy(p.lex.src, start.pos, "BUDGET = NULL removes every budget; it cannot go with another BUDGET clause")
		}
		p.budgets.Clear = true
		return p.advance()
	}
	if !p.isPunct("(") {
		return p.failWhy("expected " + budgetSyntax + ", not %s")
	}
	if err := p.advance(); err != nil {
		return err
	}
	if !p.isWord("RU") {
		return p.failWhy("a BUDGET begins with RU = n PER HOUR|DAY|WEEK|MONTH, not %s")
	}
	if err := p.advance(); err != nil {
		return err
	}
	if err := p.optionalEq(); err != nil {
		return err
	}
	ru, err := p.ruValue("BUDGET RU", false)
	if err != nil {
		return err
	}
	if !p.isWord("PER") {
		return p.failWhy("expected PER HOUR|DAY|WEEK|MONTH after BUDGET's RU = " + strconv.FormatUint(ru, 10) + ", not %s")
	}
	period, err := p.budgetPeriod()
	if err != nil {
		return err
	}
	b := Budget{Period: period, RU: ru}
	name := "BUDGET PER " + period.String()
	for {
		comma, err := p.acceptPunct(",")
		if err != nil {
			return err
		}
		if !comma && p.isPunct(")") {
			break
		}
		if !p.isWord("ON") {
			if p.atEnd() {
				return p.failWhy(name + "'s ( is not closed")
			}
			return p.failWhy("expected ON p PERCENT NOTIFY|THROTTLE(RU_PER_SEC = r)|REFUSE in " + name + ", not %s")
		}
		if len(b.Triggers) == MaxBudgetTriggers {
			return NewInvalid(fmt.Sprintf("%s: %s has more than %d triggers; a budget has at most %d",
				msgInvalidSetting, name, MaxBudgetTriggers, MaxBudgetTriggers))
		}
		t, err := p.budgetTrigger(name)
		if err != nil {
			return err
		}
		b.Triggers = append(b.Triggers, t)
	}
	if err := p.advance(); err != nil {
		return err
	}
	if len(b.Triggers) == 0 {
		b.Triggers = []BudgetTrigger{{Percent: DefaultBudgetPercent, Action: BudgetNotify}}
	}
	if p.budgetGiven(g, period) {
		return NewSyntaxWhy(p.lex.src, start.pos, name+" is given twice")
	}
	if err := b.validate(Unlimited); err != nil {
		return err
	}
	i := 0
	for i < len(g.Budgets) && g.Budgets[i].Period < period {
		i++
	}
	g.Budgets = append(g.Budgets, Budget{})
	copy(g.Budgets[i+1:], g.Budgets[i:])
	g.Budgets[i] = b
	return nil
}

// budgetGiven reports whether a BUDGET clause of the statement already
// named period.
func (p *parser) budgetGiven(g *Group, period BudgetPeriod) bool {
	if _, ok := g.BudgetFor(period); ok {
		return true
	}
	for _, d := range p.budgets.Drop {
		if d == period {
			return true
		}
	}
	return false
}

// budgetPeriod reads PER HOUR|DAY|WEEK|MONTH.
func (p *parser) budgetPeriod() (BudgetPeriod, error) {
	if err := p.expectWords("PER"); err != nil {
		return 0, err
	}
	period, ok := BudgetPeriod(0), false
	if p.tok.kind == tkWord {
		period, ok = ParseBudgetPeriod(p.tok.text)
	}
	if !ok {
		return 0, p.failWhy("a budget's period is PER HOUR, DAY, WEEK or MONTH, not %s")
	}
	return period, p.advance()
}

// budgetTrigger reads ON p PERCENT NOTIFY | THROTTLE(RU_PER_SEC = r) |
// REFUSE of the budget name.
func (p *parser) budgetTrigger(name string) (BudgetTrigger, error) {
	var t BudgetTrigger
	if err := p.expectWords("ON"); err != nil {
		return t, err
	}
	outOfRange := func(typed string) error {
		return NewInvalid(fmt.Sprintf("%s: %s: ON %s PERCENT is out of range; a trigger's percent is 1 to %d",
			msgInvalidSetting, name, typed, MaxBudgetPercent))
	}
	switch {
	case p.tok.kind == tkNumber:
		v, err := strconv.ParseUint(p.tok.text, 10, 32)
		if err != nil || v == 0 || v > MaxBudgetPercent {
			return t, outOfRange(p.tok.text)
		}
		t.Percent = uint32(v)
	case p.isPunct("-"):
		save := *p
		if err := p.advance(); err == nil && p.tok.kind == tkNumber {
			return t, outOfRange("-" + p.tok.text)
		}
		*p = save
		fallthrough
	default:
		return t, p.failWhy("a trigger's percent is a whole number from 1 to 1000 (ON 80 PERCENT), not %s")
	}
	if err := p.advance(); err != nil {
		return t, err
	}
	if err := p.expectWords("PERCENT"); err != nil {
		return t, err
	}
	action, ok := BudgetAction(0), false
	if p.tok.kind == tkWord {
		action, ok = ParseBudgetAction(p.tok.text)
	}
	if !ok {
		return t, p.failWhy("a trigger's action is NOTIFY, THROTTLE(RU_PER_SEC = r) or REFUSE, not %s")
	}
	t.Action = action
	if err := p.advance(); err != nil {
		return t, err
	}
	if action != BudgetThrottle {
		return t, nil
	}
	if !p.isPunct("(") {
		return t, p.failWhy("THROTTLE takes its rate: THROTTLE(RU_PER_SEC = r), not THROTTLE %s")
	}
	if err := p.advance(); err != nil {
		return t, err
	}
	if err := p.expectWords("RU_PER_SEC"); err != nil {
		return t, err
	}
	if err := p.optionalEq(); err != nil {
		return t, err
	}
	r, err := p.ruValue("THROTTLE RU_PER_SEC", false)
	if err != nil {
		return t, err
	}
	t.ThrottleRUPerSec = r
	return t, p.expectPunct(")")
}

// backgroundClause reads BACKGROUND [=] (UTILIZATION_LIMIT [=] n) or
// BACKGROUND [=] NULL into g, the current token being BACKGROUND. TiDB's
// TASK_TYPES has no place here: a background group is a group like any
// other, and work reaches it as it reaches any group (a binding, a hint,
// a tag or a statement shape).
func (p *parser) backgroundClause(g *Group) error {
	if err := p.advance(); err != nil {
		return err
	}
	if err := p.optionalEq(); err != nil {
		return err
	}
	if p.isWord("NULL") {
		g.Background = 0
		return p.advance()
	}
	if err := p.expectPunct("("); err != nil {
		return err
	}
	if p.isWord("TASK_TYPES") {
		return NewUnsupported("BACKGROUND's TASK_TYPES (a background group's work is what is bound to it, as for any group)")
	}
	if err := p.expectWords("UTILIZATION_LIMIT"); err != nil {
		return err
	}
	if err := p.optionalEq(); err != nil {
		return err
	}
	if p.tok.kind != tkNumber {
		return p.failWhy("UTILIZATION_LIMIT is a whole number of percent, 1 to 100, not %s")
	}
	v, err := strconv.ParseUint(p.tok.text, 10, 8)
	if err != nil || v < 1 || v > 100 {
		return errBackground(p.tok.text)
	}
	g.Background = uint8(v)
	if err := p.advance(); err != nil {
		return err
	}
	return p.expectPunct(")")
}
