package resourcegroup

import (
	"errors"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

// TestParentStatements runs a story of CREATE / ALTER / DROP with PARENT
// against a MemStore: each statement succeeds, or fails with 1105 whose
// message says why; SHOW CREATE and information_schema show the tree.
func TestParentStatements(t *testing.T) {
	s := NewMemStore()
	steps := []struct {
		sql  string
		want string // "" = success, else a part of the error's message
	}{
		{"CREATE RESOURCE GROUP org RU_PER_SEC = 5000", ""},
		{"CREATE RESOURCE GROUP team RU_PER_SEC = 2000 PARENT = org", ""},
		{"CREATE RESOURCE GROUP app1 RU_PER_SEC = 1500, BURSTABLE = UNLIMITED, PARENT = team", ""},
		{"CREATE RESOURCE GROUP app2 RU_PER_SEC = 500 PARENT team", ""},
		{"CREATE RESOURCE GROUP x RU_PER_SEC = 10 PARENT = nosuch", "PARENT resource group 'nosuch' does not exist"},
		{"CREATE RESOURCE GROUP x RU_PER_SEC = 10 PARENT = x", "cannot be its own PARENT"},
		{"CREATE RESOURCE GROUP x RU_PER_SEC = 2500 PARENT = team", "RU_PER_SEC = 2500 of resource group 'x' is above RU_PER_SEC = 2000 of its PARENT 'team'"},
		{"CREATE RESOURCE GROUP x RU_PER_SEC = UNLIMITED PARENT = team", "is above RU_PER_SEC = 2000 of its PARENT 'team'"},
		{"CREATE RESOURCE GROUP x RU_PER_SEC = 10 PARENT = app1", "in a tree 4 levels deep; at most 3 levels"},
		{"ALTER RESOURCE GROUP org PARENT = app2", "would make resource group 'org' its own ancestor"},
		{"ALTER RESOURCE GROUP team PARENT = team", "cannot be its own PARENT"},
		{"ALTER RESOURCE GROUP app1 RU_PER_SEC = 3000", "is above RU_PER_SEC = 2000 of its PARENT 'team'"},
		{"ALTER RESOURCE GROUP team RU_PER_SEC = 1000", "RU_PER_SEC = 1000 of resource group 'team' is below RU_PER_SEC = 1500 of its child 'app1'"},
		{"CREATE RESOURCE GROUP solo RU_PER_SEC = 100", ""},
		{"CREATE RESOURCE GROUP solo2 RU_PER_SEC = 100 PARENT = solo", ""},
		// solo, team, app1 would be three levels, but solo's rate is
		// below team's.
		{"ALTER RESOURCE GROUP team PARENT = solo", "is above RU_PER_SEC = 100 of its PARENT 'solo'"},
		{"ALTER RESOURCE GROUP solo2 PARENT = app2", "in a tree 4 levels deep"},
		{"DROP RESOURCE GROUP team", "resource group 'team' is the PARENT of resource group 'app"},
		{"ALTER RESOURCE GROUP app2 PARENT = NULL", ""},
		{"ALTER RESOURCE GROUP app2 RU_PER_SEC = 2500", ""},
		{"ALTER RESOURCE GROUP app2 PARENT = org", ""},
		{"ALTER RESOURCE GROUP app1 PARENT = org", ""},
		{"DROP RESOURCE GROUP team", ""},
	}
	for _, st := range steps {
		_, err := run(t, s, st.sql)
		switch {
		case st.want == "" && err != nil:
			t.Fatalf("%s: %v", st.sql, err)
		case st.want != "" && err == nil:
			t.Fatalf("%s: succeeded, want an error saying %q", st.sql, st.want)
		case st.want != "":
			var e *Error
			if !errors.As(err, &e) || e.Code != 1105 || !strings.Contains(e.Message, st.want) {
				t.Fatalf("%s: %v, want 1105 saying %q", st.sql, err, st.want)
			}
		}
	}
	r := mustRun(t, s, "SHOW CREATE RESOURCE GROUP app1")
	want := "CREATE RESOURCE GROUP `app1` RU_PER_SEC=1500 PRIORITY=MEDIUM BURSTABLE=UNLIMITED PARENT=`org`"
	if got := *r.Rows[0][1]; got != want {
		t.Errorf("SHOW CREATE app1:\n got  %s\n want %s", got, want)
	}
	// SHOW CREATE replays: the statement parses back to the same group.
	g, err := s.GetGroup(t.Context(), "app1")
	if err != nil {
		t.Fatal(err)
	}
	st, err := Parse(want, sqltext.Mode{})
	if err != nil {
		t.Fatal(err)
	}
	if c := st.(*CreateGroup).Group; c.Parent != g.Parent || c.RUPerSec != g.RUPerSec || c.Burst != g.Burst {
		t.Errorf("SHOW CREATE parses back to %+v, want %+v", c, g)
	}
	r = mustRun(t, s, "SELECT NAME, PARENT FROM information_schema.resource_groups")
	got := map[string]string{}
	for _, row := range rows(r) {
		got[row[0]] = row[1]
	}
	for name, parent := range map[string]string{"org": "NULL", "app1": "org", "app2": "org", "solo2": "solo", "default": "NULL"} {
		if got[name] != parent {
			t.Errorf("information_schema: %s's PARENT %q, want %q (%v)", name, got[name], parent, got)
		}
	}
}

// TestParentSyntax: PARENT's value is a group name or NULL, once.
func TestParentSyntax(t *testing.T) {
	for _, tt := range []struct {
		sql, parent string
		err         bool
	}{
		{"CREATE RESOURCE GROUP a RU_PER_SEC = 1 PARENT = `Team X`", "team x", false},
		{"ALTER RESOURCE GROUP a PARENT = NULL", "", false},
		{"ALTER RESOURCE GROUP a PARENT = `null`", "null", false},
		{"ALTER RESOURCE GROUP a PARENT = 'team'", "", true},
		{"ALTER RESOURCE GROUP a PARENT = t1 PARENT = t2", "", true},
		{"ALTER RESOURCE GROUP a PARENT =", "", true},
	} {
		st, err := Parse(tt.sql, sqltext.Mode{})
		if (err != nil) != tt.err {
			t.Errorf("%s: error %v, want error %v", tt.sql, err, tt.err)
			continue
		}
		if err != nil {
			continue
		}
		var got string
		switch s := st.(type) {
		case *CreateGroup:
			got = s.Group.Parent
		case *AlterGroup:
			if s.Fields&FieldParent == 0 {
				t.Errorf("%s: FieldParent not set", tt.sql)
			}
			got = s.Options.Parent
		}
		if got != tt.parent {
			t.Errorf("%s: parent %q, want %q", tt.sql, got, tt.parent)
		}
	}
}
