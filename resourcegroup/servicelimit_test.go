package resourcegroup

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestParseServiceLimit(t *testing.T) {
	tests := []struct {
		sql     string
		want    Statement
		errCode uint16
		errHas  string
	}{
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = 8000", want: &AlterServiceLimit{RUPerSec: 8000}},
		{sql: "alter resource control service limit 1", want: &AlterServiceLimit{RUPerSec: 1}},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = UNLIMITED;", want: &AlterServiceLimit{}},
		{sql: "SHOW RESOURCE CONTROL", want: &ShowResourceControl{}},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = -5", errCode: CodeUnknown, errHas: "SERVICE LIMIT = -5 is out of range"},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = 0", errCode: CodeUnknown, errHas: "is out of range"},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = 99999999999999999999999", errCode: CodeUnknown, errHas: "is out of range"},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = 1000000000000000001", errCode: CodeUnknown, errHas: "is out of range"},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = '8000'", errCode: 1064, errHas: "without quotes"},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT = 1.5", errCode: 1064},
		{sql: "ALTER RESOURCE CONTROL SERVICE LIMIT", errCode: 1064},
		{sql: "ALTER RESOURCE CONTROL PRIORITY = HIGH", errCode: 1064, errHas: "SERVICE LIMIT"},
		{sql: "SHOW RESOURCE CONTROL x", errCode: 1064},
	}
	for _, tc := range tests {
		got, err := Parse(tc.sql, sqltext.Mode{})
		if tc.errCode != 0 {
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.errCode || !strings.Contains(e.Message, tc.errHas) {
				t.Errorf("%s: got %v, %v; want error %d containing %q", tc.sql, got, err, tc.errCode, tc.errHas)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.sql, err)
			continue
		}
		if !sameStatement(got, tc.want) {
			t.Errorf("%s: got %#v, want %#v", tc.sql, got, tc.want)
		}
		if !IsAdmin(tc.sql, sqltext.Mode{}) {
			t.Errorf("%s: IsAdmin false", tc.sql)
		}
	}
	if !RequiresSuper(&AlterServiceLimit{}) || RequiresSuper(&ShowResourceControl{}) {
		t.Error("ALTER RESOURCE CONTROL needs SUPER, SHOW RESOURCE CONTROL not")
	}
}

func sameStatement(a, b Statement) bool {
	switch x := a.(type) {
	case *AlterServiceLimit:
		y, ok := b.(*AlterServiceLimit)
		return ok && *x == *y
	case *ShowResourceControl:
		_, ok := b.(*ShowResourceControl)
		return ok
	}
	return false
}

func TestExecuteServiceLimitMemStore(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	if err := s.CreateGroup(ctx, Group{Name: "a", RUPerSec: 300}); err != nil {
		t.Fatal(err)
	}
	show := func() []string {
		t.Helper()
		res, err := Execute(ctx, &ShowResourceControl{}, s)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range res.Rows[0] {
			out = append(out, *v)
		}
		return out
	}
	if got := strings.Join(show()[:3], " "); got != "UNLIMITED FLAG 300.0" {
		t.Errorf("fresh store: %q", got)
	}
	if _, err := Execute(ctx, &AlterServiceLimit{RUPerSec: 8000}, s); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(show()[:3], " "); got != "8000 SQL 300.0" {
		t.Errorf("after ALTER: %q", got)
	}
	if _, err := Execute(ctx, &AlterServiceLimit{RUPerSec: MaxRU + 1}, s); !errors.Is(err, ErrInvalid) {
		t.Errorf("beyond MaxRU: %v", err)
	}
}
