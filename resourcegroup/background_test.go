package resourcegroup

import (
	"errors"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

// TestBackgroundSyntax: BACKGROUND = (UTILIZATION_LIMIT = n), 1 to 100,
// or NULL; SHOW CREATE and information_schema.resource_groups write it
// back, and SHOW CREATE's text parses to the same group.
func TestBackgroundSyntax(t *testing.T) {
	for _, tt := range []struct {
		sql  string
		pct  uint8
		code uint16
		msg  string
	}{
		{"CREATE RESOURCE GROUP nightly RU_PER_SEC = 100 BACKGROUND = (UTILIZATION_LIMIT = 30)", 30, 0, ""},
		{"CREATE RESOURCE GROUP nightly RU_PER_SEC = 100, BACKGROUND (utilization_limit 100)", 100, 0, ""},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = NULL", 0, 0, ""},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = (UTILIZATION_LIMIT = 0)", 0, 1105, "1 to 100"},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = (UTILIZATION_LIMIT = 101)", 0, 1105, "1 to 100"},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = (UTILIZATION_LIMIT = 99999999999999999999)", 0, 1105, "1 to 100"},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = (UTILIZATION_LIMIT = '30')", 0, 1064, "whole number of percent"},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = (UTILIZATION_LIMIT = 30", 0, 1064, "expected ')'"},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = (TASK_TYPES = 'ddl')", 0, 1235, "TASK_TYPES"},
		{"ALTER RESOURCE GROUP nightly BACKGROUND = NULL BACKGROUND = NULL", 0, 1064, "given twice"},
	} {
		st, err := Parse(tt.sql, sqltext.Mode{})
		if tt.code != 0 {
			var e *Error
			if !errors.As(err, &e) || e.Code != tt.code || !strings.Contains(e.Error(), tt.msg) {
				t.Errorf("%s: %v, want %d saying %q", tt.sql, err, tt.code, tt.msg)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.sql, err)
			continue
		}
		var g Group
		switch s := st.(type) {
		case *CreateGroup:
			g = s.Group
		case *AlterGroup:
			if s.Fields&FieldBackground == 0 {
				t.Errorf("%s: FieldBackground not set", tt.sql)
			}
			g = s.Options
		}
		if g.Background != tt.pct {
			t.Errorf("%s: UTILIZATION_LIMIT %d, want %d", tt.sql, g.Background, tt.pct)
		}
	}

	g := Group{Name: "nightly", RUPerSec: 100, Priority: PriorityMedium, Burst: BurstOff, Background: 30}
	text := g.SQL()
	if !strings.HasSuffix(text, " BACKGROUND=(UTILIZATION_LIMIT=30)") {
		t.Errorf("SHOW CREATE: %s", text)
	}
	st, err := Parse(text, sqltext.Mode{})
	if err != nil {
		t.Fatalf("SHOW CREATE's text %q: %v", text, err)
	}
	if back := st.(*CreateGroup).Group; back.Background != 30 {
		t.Errorf("SHOW CREATE's text parses to UTILIZATION_LIMIT %d", back.Background)
	}
	row := InfoSchemaRow(g)
	if row[5] == nil || *row[5] != "UTILIZATION_LIMIT=30" {
		t.Errorf("information_schema BACKGROUND: %v", row[5])
	}
	if row := InfoSchemaRow(Group{Name: "fg", RUPerSec: 1}); row[5] != nil {
		t.Errorf("a foreground group's BACKGROUND: %q, want NULL", *row[5])
	}
}
