package resourcegroup

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

// run parses and executes sql against s.
func run(t *testing.T, s Store, sql string) (*Result, error) {
	t.Helper()
	st, err := Parse(sql, sqltext.Mode{})
	if err != nil {
		t.Fatalf("Parse(%s): %v", sql, err)
	}
	return Execute(context.Background(), st, s)
}

func mustRun(t *testing.T, s Store, sql string) *Result {
	t.Helper()
	r, err := run(t, s, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return r
}

func rows(r *Result) [][]string {
	out := make([][]string, len(r.Rows))
	for i, row := range r.Rows {
		out[i] = deref(row)
	}
	return out
}

func TestExecuteScenario(t *testing.T) {
	s := NewMemStore()
	steps := []struct {
		sql      string
		code     uint16 // 0 = success
		warn     uint16 // code of the one expected warning
		cols     []string
		wantRows [][]string
	}{
		{sql: "SELECT * FROM information_schema.resource_groups",
			cols:     []string{"NAME", "RU_PER_SEC", "PRIORITY", "BURSTABLE", "QUERY_LIMIT", "BACKGROUND", "MODE", "MAX_CONCURRENCY", "BUDGETS", "PARENT"},
			wantRows: [][]string{{"default", "UNLIMITED", "MEDIUM", "UNLIMITED", "NULL", "NULL", "ENFORCE", "NULL", "NULL", "NULL"}}},
		{sql: "CREATE RESOURCE GROUP rg1 RU_PER_SEC=500"},
		{sql: "CREATE RESOURCE GROUP RG1 RU_PER_SEC=100", code: 8248},
		{sql: "CREATE RESOURCE GROUP IF NOT EXISTS rg1 RU_PER_SEC=100", warn: 8248},
		{sql: "ALTER RESOURCE GROUP rg1 PRIORITY=HIGH BURSTABLE QUERY_LIMIT=(EXEC_ELAPSED='60s' ACTION=KILL WATCH=SIMILAR DURATION='10m')"},
		{sql: "SHOW CREATE RESOURCE GROUP Rg1", cols: []string{"Resource_Group", "Create Resource Group"},
			wantRows: [][]string{{"rg1", "CREATE RESOURCE GROUP `rg1` RU_PER_SEC=500 PRIORITY=HIGH BURSTABLE=MODERATED QUERY_LIMIT=(EXEC_ELAPSED='1m0s', ACTION=KILL, WATCH=SIMILAR DURATION='10m0s')"}}},
		{sql: "SHOW CREATE RESOURCE GROUP `default`", cols: []string{"Resource_Group", "Create Resource Group"},
			wantRows: [][]string{{"default", "CREATE RESOURCE GROUP `default` RU_PER_SEC=UNLIMITED PRIORITY=MEDIUM BURSTABLE=UNLIMITED"}}},
		{sql: "SHOW CREATE RESOURCE GROUP nope", code: 8249},
		{sql: "ALTER RESOURCE GROUP rg1 RU_PER_SEC=800"},
		{sql: "SELECT name, ru_per_sec, query_limit FROM information_schema.resource_groups WHERE name = 'RG1'",
			cols:     []string{"NAME", "RU_PER_SEC", "QUERY_LIMIT"},
			wantRows: [][]string{{"rg1", "800", "EXEC_ELAPSED='1m0s', ACTION=KILL, WATCH=SIMILAR DURATION='10m0s'"}}},
		{sql: "ALTER RESOURCE GROUP rg1 QUERY_LIMIT=NULL"},
		{sql: "SELECT burstable, query_limit FROM information_schema.resource_groups WHERE name = 'rg1'",
			cols: []string{"BURSTABLE", "QUERY_LIMIT"}, wantRows: [][]string{{"MODERATED", "NULL"}}},
		{sql: "SELECT * FROM information_schema.resource_groups WHERE name = 'nope'",
			cols: []string{"NAME", "RU_PER_SEC", "PRIORITY", "BURSTABLE", "QUERY_LIMIT", "BACKGROUND", "MODE", "MAX_CONCURRENCY", "BUDGETS", "PARENT"}, wantRows: [][]string{}},
		{sql: "ALTER RESOURCE GROUP rg1 MODE = WARN MAX_CONCURRENCY = 3"},
		{sql: "SELECT mode, max_concurrency FROM information_schema.resource_groups WHERE name = 'rg1'",
			cols: []string{"MODE", "MAX_CONCURRENCY"}, wantRows: [][]string{{"WARN", "3"}}},
		{sql: "ALTER RESOURCE GROUP rg1 MODE = ENFORCE, MAX_CONCURRENCY = NULL"},
		{sql: "SELECT mode, max_concurrency FROM information_schema.resource_groups WHERE name = 'rg1'",
			cols: []string{"MODE", "MAX_CONCURRENCY"}, wantRows: [][]string{{"ENFORCE", "NULL"}}},
		{sql: "ALTER RESOURCE GROUP nope RU_PER_SEC=1", code: 8249},
		{sql: "ALTER RESOURCE GROUP IF EXISTS nope RU_PER_SEC=1", warn: 8249},
		{sql: "ALTER RESOURCE GROUP rg1 QUERY_LIMIT=(RU=10 ACTION=SWITCH_GROUP(nope))", code: 8249},
		{sql: "CREATE RESOURCE GROUP rg2 RU_PER_SEC=5 QUERY_LIMIT=(RU=10 ACTION=SWITCH_GROUP(nope))", code: 8249},
		{sql: "CREATE RESOURCE GROUP rg2 RU_PER_SEC=5 QUERY_LIMIT=(RU=10 ACTION=SWITCH_GROUP(rg1))"},
		{sql: "ALTER RESOURCE GROUP `default` RU_PER_SEC=1000 BURSTABLE=OFF"},
		{sql: "SELECT name, ru_per_sec, burstable FROM information_schema.resource_groups",
			cols:     []string{"NAME", "RU_PER_SEC", "BURSTABLE"},
			wantRows: [][]string{{"default", "1000", "OFF"}, {"rg1", "800", "MODERATED"}, {"rg2", "5", "OFF"}}},
		{sql: "ALTER USER 'app'@'%' RESOURCE GROUP nope", code: 8249},
		{sql: "ALTER USER 'app'@'%' RESOURCE GROUP rg1"},
		{sql: "DROP RESOURCE GROUP `Default`", code: 1105},
		{sql: "DROP RESOURCE GROUP rg2"},
		{sql: "DROP RESOURCE GROUP rg2", code: 8249},
		{sql: "DROP RESOURCE GROUP IF EXISTS rg2", warn: 8249},
	}
	for _, st := range steps {
		r, err := run(t, s, st.sql)
		if st.code != 0 {
			var e *Error
			if !errors.As(err, &e) || e.Code != st.code {
				t.Fatalf("%s: error %v, want code %d", st.sql, err, st.code)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", st.sql, err)
		}
		if st.warn != 0 && (len(r.Warnings) != 1 || r.Warnings[0].Code != st.warn) {
			t.Fatalf("%s: warnings %v, want one %d", st.sql, r.Warnings, st.warn)
		}
		if st.warn == 0 && len(r.Warnings) != 0 {
			t.Fatalf("%s: unexpected warnings %v", st.sql, r.Warnings)
		}
		if r.IsResultSet() != (st.cols != nil) {
			t.Fatalf("%s: IsResultSet = %v", st.sql, r.IsResultSet())
		}
		if st.cols != nil {
			if !reflect.DeepEqual(r.Columns, st.cols) || !reflect.DeepEqual(rows(r), st.wantRows) {
				t.Fatalf("%s:\n got  %v %v\n want %v %v", st.sql, r.Columns, rows(r), st.cols, st.wantRows)
			}
		}
	}
	ctx := context.Background()
	if b, err := s.GetBinding(ctx, "app", "%"); err != nil || b.Group != "rg1" || b.Host != "%" {
		t.Fatalf("binding = %+v, %v", b, err)
	}
	mustRun(t, s, "ALTER USER app RESOURCE GROUP ``")
	if _, err := s.GetBinding(ctx, "app", "%"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after binding to ``: %v", err)
	}
	mustRun(t, s, "ALTER USER app RESOURCE GROUP rg1")
	mustRun(t, s, "ALTER USER app RESOURCE GROUP DEFAULT")
	if _, err := s.GetBinding(ctx, "app", "%"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after binding to DEFAULT: %v", err)
	}
}

func TestExecuteSessionBound(t *testing.T) {
	s := NewMemStore()
	for _, sql := range []string{"SET RESOURCE GROUP x", "SELECT CURRENT_RESOURCE_GROUP()", "SHOW RESOURCE GROUP USAGE", "SHOW LAST STATEMENT RU"} {
		if _, err := run(t, s, sql); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported", sql, err)
		}
	}
	if _, err := Execute(context.Background(), nil, s); !errors.Is(err, ErrUnsupported) {
		t.Errorf("nil statement: %v", err)
	}
}

// failStore fails every call, to check that Execute passes errors through.
type failStore struct{ Store }

var errBackend = errors.New("backend down")

func (failStore) CreateGroup(context.Context, Group) error         { return errBackend }
func (failStore) AlterGroup(context.Context, Group) error          { return errBackend }
func (failStore) DropGroup(context.Context, string) error          { return errBackend }
func (failStore) GetGroup(context.Context, string) (Group, error)  { return Group{}, errBackend }
func (failStore) ListGroups(context.Context) ([]Group, error)      { return nil, errBackend }
func (failStore) BindUser(context.Context, Binding) error          { return errBackend }
func (failStore) UnbindUser(context.Context, string, string) error { return errBackend }
func (failStore) GetBinding(context.Context, string, string) (Binding, error) {
	return Binding{}, errBackend
}
func (failStore) ListBindings(context.Context) ([]Binding, error) { return nil, errBackend }

func TestExecuteStoreErrors(t *testing.T) {
	for _, sql := range []string{
		"CREATE RESOURCE GROUP x RU_PER_SEC=1",
		"CREATE RESOURCE GROUP x RU_PER_SEC=1 QUERY_LIMIT=(RU=1 ACTION=SWITCH_GROUP(y))",
		"ALTER RESOURCE GROUP x RU_PER_SEC=1",
		"DROP RESOURCE GROUP x",
		"ALTER USER u RESOURCE GROUP x",
		"ALTER USER u RESOURCE GROUP default",
		"SHOW CREATE RESOURCE GROUP x",
		"SELECT * FROM information_schema.resource_groups",
		"SELECT * FROM information_schema.resource_groups WHERE name = 'x'",
	} {
		if _, err := run(t, failStore{}, sql); !errors.Is(err, errBackend) {
			t.Errorf("%s: %v, want the store's error", sql, err)
		}
	}
	// An ALTER whose result is invalid is refused before writing.
	s := NewMemStore()
	mustRun(t, s, "CREATE RESOURCE GROUP x RU_PER_SEC=1 QUERY_LIMIT=(RU=1 ACTION=KILL)")
	mustRun(t, s, "CREATE RESOURCE GROUP y RU_PER_SEC=1")
	if _, err := Execute(context.Background(), &AlterGroup{Name: "y", Fields: FieldQueryLimit,
		Options: Group{QueryLimit: &QueryLimit{RU: 1, Action: ActionSwitchGroup, SwitchGroup: "y"}}}, s); !errors.Is(err, ErrInvalid) {
		t.Errorf("switch to self via ALTER: %v", err)
	}
	if _, err := Execute(context.Background(), &CreateGroup{Group: Group{Name: "z"}}, s); !errors.Is(err, ErrInvalid) {
		t.Errorf("create without RU_PER_SEC: %v", err)
	}
	if _, err := Execute(context.Background(), &SelectGroups{Columns: []string{"BOGUS"}}, s); !errors.Is(err, ErrUnsupported) {
		t.Errorf("bogus column: %v", err)
	}
	r, err := Execute(context.Background(), &SelectGroups{}, s)
	if err != nil || len(r.Columns) != 10 || len(r.Rows) != 3 {
		t.Errorf("no columns = all columns: %v %v", r, err)
	}
}

// HoldsAdmin compares whole values, exactly: only the privilege names
// SUPER and RESOURCE_GROUP_ADMIN and the role name rgproxy_admin count.
func TestHoldsAdmin(t *testing.T) {
	tests := []struct {
		name         string
		privs, roles []string
		want         bool
	}{
		{"super", []string{"USAGE", "SUPER"}, nil, true},
		{"mysql 8 dynamic privilege", []string{"RESOURCE_GROUP_ADMIN"}, nil, true},
		{"the role", nil, []string{"dba", "rgproxy_admin"}, true},
		{"nothing", nil, nil, false},
		{"usage", []string{"USAGE", "SELECT", "PROCESS", "CONNECTION ADMIN"}, []string{"dba"}, false},
		{"lower case", []string{"super"}, []string{"RGPROXY_ADMIN"}, false},
		{"padded", []string{" SUPER", "SUPER "}, []string{"rgproxy_admin "}, false},
		{"a list in one value", []string{"SELECT, SUPER"}, []string{"x`, SUPER ON *.* TO y"}, false},
		{"a privilege as a role", nil, []string{"SUPER"}, false},
		{"the role as a privilege", []string{"rgproxy_admin"}, nil, false},
	}
	for _, tt := range tests {
		if got := HoldsAdmin(tt.privs, tt.roles); got != tt.want {
			t.Errorf("%s: HoldsAdmin(%q, %q) = %v, want %v", tt.name, tt.privs, tt.roles, got, tt.want)
		}
	}
	if got := Grantee("app", "10.%"); got != "'app'@'10.%'" {
		t.Errorf("Grantee = %s", got)
	}
}

// A group that another group's SWITCH_GROUP names cannot be dropped until
// that rule changes: the rule would switch to nothing.
func TestDropSwitchTargetRefused(t *testing.T) {
	s := NewMemStore()
	for _, q := range []string{
		"CREATE RESOURCE GROUP rg2 RU_PER_SEC = 10",
		"CREATE RESOURCE GROUP rg1 RU_PER_SEC = 10 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = SWITCH_GROUP(rg2))",
	} {
		if _, err := run(t, s, q); err != nil {
			t.Fatal(err)
		}
	}
	_, err := run(t, s, "DROP RESOURCE GROUP rg2")
	var re *Error
	if !errors.As(err, &re) || re.Code != 1105 || !strings.Contains(re.Message, "SWITCH_GROUP target of resource group 'rg1'") {
		t.Fatalf("drop of a switch target: %v", err)
	}
	if _, err := run(t, s, "ALTER RESOURCE GROUP rg1 QUERY_LIMIT = NULL"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, s, "DROP RESOURCE GROUP rg2"); err != nil {
		t.Fatalf("drop once the rule is gone: %v", err)
	}
}

func TestExecuteTagBindings(t *testing.T) {
	s := NewMemStore()
	ctx := context.Background()
	mustRun(t, s, "CREATE RESOURCE GROUP rg_reports RU_PER_SEC = 10")
	mustRun(t, s, "CREATE RESOURCE GROUP rg2 RU_PER_SEC = 10")
	mustRun(t, s, "ALTER USER app RESOURCE GROUP rg2")
	code := func(sql string) uint16 {
		t.Helper()
		_, err := run(t, s, sql)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: %v, want an *Error", sql, err)
		}
		return e.Code
	}
	if c := code("CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO nope"); c != 8249 {
		t.Fatalf("binding to a missing group: %d, want 8249", c)
	}
	if c := code("CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO `default`"); c != 1105 {
		t.Fatalf("binding to default: %d, want 1105", c)
	}
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO rg2")
	// Creating again replaces.
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO RG_Reports")
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR TAG 'a=b' = 'c=d' TO rg2")
	bs, err := s.ListBindings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Binding{
		{User: "app", Host: "%", Group: "rg2"},
		{TagKey: "a=b", TagValue: "c=d", Group: "rg2"},
		{TagKey: "route", TagValue: "/report", Group: "rg_reports"},
	}
	if !reflect.DeepEqual(bs, want) {
		t.Fatalf("bindings:\n got  %+v\n want %+v", bs, want)
	}
	// The account binding is not the tag's: DROP of a tag leaves it.
	mustRun(t, s, "DROP RESOURCE GROUP BINDING FOR TAG route = '/report'")
	if c := code("DROP RESOURCE GROUP BINDING FOR TAG route = '/report'"); c != 1105 {
		t.Fatalf("second drop: %d, want 1105", c)
	}
	r := mustRun(t, s, "DROP RESOURCE GROUP BINDING IF EXISTS FOR TAG route = '/report'")
	if len(r.Warnings) != 1 || !errors.Is(r.Warnings[0], ErrNotFound) ||
		r.Warnings[0].Message != "tag route='/report' has no resource group binding" {
		t.Fatalf("IF EXISTS of a missing binding: %+v", r.Warnings)
	}
	// The value is matched exactly.
	if c := code("DROP RESOURCE GROUP BINDING FOR TAG 'a=b' = 'C=D'"); c != 1105 {
		t.Fatalf("drop with another case: %d", c)
	}
	mustRun(t, s, "DROP RESOURCE GROUP BINDING FOR TAG `a=b` = 'c=d'")
	if bs, _ := s.ListBindings(ctx); !reflect.DeepEqual(bs, want[:1]) {
		t.Fatalf("after the drops: %+v", bs)
	}
	for _, sql := range []string{
		"CREATE RESOURCE GROUP BINDING FOR TAG k = 'v' TO rg2",
		"DROP RESOURCE GROUP BINDING FOR TAG k = 'v'",
	} {
		if _, err := run(t, failStore{}, sql); !errors.Is(err, errBackend) {
			t.Errorf("%s: %v, want the store's error", sql, err)
		}
	}
	if _, err := Execute(ctx, &CreateTagBinding{Value: "v", Group: "rg2"}, s); !errors.Is(err, ErrInvalid) {
		t.Errorf("an empty key: %v", err)
	}
}
