package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// recordingTokens is the policy's view of tokenclient for unit tests: it
// records what is acquired and charged and refuses when told to.
type recordingTokens struct {
	groups   map[string]resourcegroup.Group
	bindings map[string]resourcegroup.Binding
	refuse   bool
	acquired []string // group:maxWait
	charged  []string // group
	ru       float64
}

func (r *recordingTokens) Acquire(_ context.Context, group string, c ru.Consumption, maxWait time.Duration) (time.Duration, error) {
	if _, ok := r.groups[group]; !ok {
		return 0, tokenclient.ErrUnknownGroup
	}
	r.acquired = append(r.acquired, group+":"+maxWait.String())
	if r.refuse {
		return maxWait, tokenclient.ErrThrottled
	}
	r.ru += c.RU()
	return 0, nil
}

func (r *recordingTokens) Charge(group string, c ru.Consumption) {
	r.charged = append(r.charged, group)
	r.ru += c.RU()
}

func (r *recordingTokens) Group(name string) (resourcegroup.Group, bool) {
	g, ok := r.groups[name]
	return g, ok
}

func (r *recordingTokens) Binding(user string) (resourcegroup.Binding, bool) {
	b, ok := r.bindings[user]
	return b, ok
}

func (r *recordingTokens) Store() resourcegroup.Store               { return resourcegroup.NewMemStore() }
func (r *recordingTokens) Usage(time.Time) []tokenclient.GroupUsage { return nil }

// grants answers SHOW GRANTS like the backend would.
type grants []string

func (g grants) Query(_ context.Context, sql string) ([]string, [][]*string, error) {
	if sql != "SHOW GRANTS" {
		return nil, nil, errors.New("unexpected query " + sql)
	}
	var rows [][]*string
	for i := range g {
		rows = append(rows, []*string{&g[i]})
	}
	return []string{"Grants"}, rows, nil
}

var (
	superGrants = grants{"GRANT ALL PRIVILEGES ON *.* TO `root`@`%`"}
	plainGrants = grants{"GRANT USAGE ON *.* TO `app`@`%`", "GRANT SELECT ON `db`.* TO `app`@`%`"}
)

func newTestPolicy(tok *recordingTokens) *rgPolicy {
	return &rgPolicy{tokens: tok, cost: ru.DefaultConfig(), strict: true, maxWait: 30 * time.Second,
		txnWait: 100 * time.Millisecond, admission: newAdmission(0), metrics: newMetrics(),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now}
}

func testGroups() *recordingTokens {
	return &recordingTokens{
		groups: map[string]resourcegroup.Group{
			"default": resourcegroup.DefaultGroupDefinition(),
			"bound":   {Name: "bound", RUPerSec: 100},
			"other":   {Name: "other", RUPerSec: 100},
		},
		bindings: map[string]resourcegroup.Binding{"app": {User: "app", Group: "bound"}},
	}
}

func query(q string) *mysqlproto.Statement {
	return &mysqlproto.Statement{Command: mysql.COM_QUERY, Class: mysqlproto.ClassRead, Query: q, PayloadBytes: int64(len(q) + 1)}
}

func TestPolicyResolvesGroups(t *testing.T) {
	tests := []struct {
		name   string
		user   string
		grants grants
		set    string // SET RESOURCE GROUP first, if any
		query  string
		want   string // group charged, or "1227"
	}{
		{"binding", "app", plainGrants, "", "SELECT 1", "bound"},
		{"no binding: default", "nobody", plainGrants, "", "SELECT 1", "default"},
		{"hint naming the bound group", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(bound) */ 1", "bound"},
		{"hint naming default", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(default) */ 1", "default"},
		{"strict: hint naming another group", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(other) */ 1", "1227"},
		{"SUPER may hint any group", "app", superGrants, "", "SELECT /*+ RESOURCE_GROUP(OTHER) */ 1", "other"},
		{"hint of an unknown group: the binding", "app", superGrants, "", "SELECT /*+ RESOURCE_GROUP(gone) */ 1", "bound"},
		{"SET wins over the binding", "app", superGrants, "SET RESOURCE GROUP other", "SELECT 1", "other"},
		{"hint wins over SET", "app", superGrants, "SET RESOURCE GROUP other", "SELECT /*+ RESOURCE_GROUP(bound) */ 1", "bound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := testGroups()
			s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: tc.user})
			ctx := context.Background()
			if tc.set != "" {
				if v := s.Before(ctx, query(tc.set), tc.grants); v.Reply == nil || v.Reply.Err != nil {
					t.Fatalf("%s: %+v", tc.set, v.Reply)
				}
			}
			st := query(tc.query)
			v := s.Before(ctx, st, tc.grants)
			if tc.want == "1227" {
				if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1227 {
					t.Fatalf("want 1227, got %+v", v.Reply)
				}
				if len(tok.acquired) != 0 {
					t.Fatalf("a refused statement acquired tokens: %v", tok.acquired)
				}
				return
			}
			if v.Reply != nil {
				t.Fatalf("statement answered locally: %+v", v.Reply.Err)
			}
			if len(tok.acquired) != 1 || tok.acquired[0] != tc.want+":30s" {
				t.Fatalf("acquired %v, want %s:30s", tok.acquired, tc.want)
			}
			s.After(st, &mysqlproto.Outcome{ResponseBytes: 100, BackendTime: 3 * time.Millisecond})
			if len(tok.charged) != 1 || tok.charged[0] != tc.want {
				t.Fatalf("post-charged %v, want %s", tok.charged, tc.want)
			}
		})
	}
}

func TestPolicyTransactionsAndThrottling(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"})

	// Outside a transaction, a refused statement gets 8252 and is not forwarded.
	tok.refuse = true
	v := s.Before(ctx, query("SELECT 1"), plainGrants)
	if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 8252 {
		t.Fatalf("want 8252, got %+v", v.Reply)
	}
	// Inside one it waits at most max-wait-in-txn, then runs on debt.
	st := query("UPDATE t SET a = 1")
	st.Class, st.InTransaction = mysqlproto.ClassWrite, true
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("in a transaction the statement must run on debt, got %+v", v.Reply.Err)
	}
	if got := tok.acquired[len(tok.acquired)-1]; got != "bound:100ms" {
		t.Fatalf("in-transaction wait %s, want bound:100ms", got)
	}
	if len(tok.charged) != 1 {
		t.Fatalf("the refused in-transaction statement was not charged as debt: %v", tok.charged)
	}
	// COMMIT and ROLLBACK never wait.
	for _, q := range []string{"COMMIT", "commit work", "ROLLBACK"} {
		n := len(tok.acquired)
		st := query(q)
		st.Class, st.InTransaction = mysqlproto.ClassWrite, true
		if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
			t.Fatalf("%s refused: %+v", q, v.Reply.Err)
		}
		if len(tok.acquired) != n {
			t.Fatalf("%s waited for tokens", q)
		}
	}
	if endsTransaction("ROLLBACK TO SAVEPOINT a") {
		t.Fatal("ROLLBACK TO SAVEPOINT keeps the transaction open")
	}
}

func TestPolicyAdminStatements(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"})
	code := func(st *mysqlproto.Statement, g grants) uint16 {
		v := s.Before(ctx, st, g)
		if v.Reply == nil {
			t.Fatalf("%s was forwarded", st.Query)
		}
		if v.Reply.Err == nil {
			return 0
		}
		return v.Reply.Err.Code
	}
	if c := code(query("CREATE RESOURCE GROUP x RU_PER_SEC = 1"), plainGrants); c != 1227 {
		t.Fatalf("CREATE without SUPER: %d", c)
	}
	if c := code(query("CREATE RESOURCE GROUP x RU_PER_SEC = 1"), superGrants); c != 0 {
		t.Fatalf("CREATE with SUPER: %d", c)
	}
	prep := query("SELECT * FROM information_schema.resource_groups")
	prep.Command = mysql.COM_STMT_PREPARE
	if c := code(prep, superGrants); c != 1295 {
		t.Fatalf("prepared admin statement: %d", c)
	}
	multi := query("SELECT 1; DROP RESOURCE GROUP x")
	multi.Multi = true
	if c := code(multi, superGrants); c != 1295 {
		t.Fatalf("admin statement inside a multi-statement: %d", c)
	}
	if c := code(query("SET RESOURCE GROUP nope"), superGrants); c != 8249 {
		t.Fatalf("SET of an unknown group: %d", c)
	}
	if len(tok.acquired)+len(tok.charged) != 0 {
		t.Fatalf("admin statements are free: %v %v", tok.acquired, tok.charged)
	}
}
