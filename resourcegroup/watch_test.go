package resourcegroup

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestParseWatch(t *testing.T) {
	tests := []struct {
		sql  string
		want Statement
	}{
		{"QUERY WATCH ADD RESOURCE GROUP rg1 SQL TEXT EXACT TO 'select * from t'",
			&QueryWatchAdd{Group: "rg1", Match: WatchExact, Text: "select * from t"}},
		{"query watch add sql text similar to \"select 1\", action = switch_group(RG2) resource group rg1;",
			&QueryWatchAdd{Group: "rg1", Action: ActionSwitchGroup, SwitchGroup: "rg2", Match: WatchSimilar, Text: "select 1"}},
		{"QUERY WATCH ADD ACTION KILL SQL DIGEST 'abc'",
			&QueryWatchAdd{Action: ActionKill, Match: WatchSimilar, Digest: "abc"}},
		{"QUERY WATCH REMOVE 12", &QueryWatchRemove{ID: 12}},
		{"QUERY WATCH REMOVE RESOURCE GROUP Rg1", &QueryWatchRemove{Group: "rg1"}},
		{"SELECT * FROM information_schema.runaway_watches;", &SelectWatches{}},
	}
	for _, tt := range tests {
		got, err := Parse(tt.sql, sqltext.Mode{})
		if err != nil {
			t.Fatalf("Parse(%s): %v", tt.sql, err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Parse(%s)\n got  %#v\n want %#v", tt.sql, got, tt.want)
		}
		if !IsAdmin(tt.sql, sqltext.Mode{}) {
			t.Errorf("IsAdmin(%s) = false", tt.sql)
		}
		_, isSelect := got.(*SelectWatches)
		if RequiresSuper(got) == isSelect {
			t.Errorf("RequiresSuper(%s) = %v", tt.sql, RequiresSuper(got))
		}
	}
	errs := []struct {
		sql  string
		code uint16
		msg  string
	}{
		{"QUERY WATCH ADD RESOURCE GROUP rg1", 1105, "needs SQL TEXT or SQL DIGEST"},
		{"QUERY WATCH ADD SQL TEXT PLAN TO 'x'", 1235, "SQL TEXT PLAN"},
		{"QUERY WATCH ADD PLAN DIGEST 'x'", 1235, "PLAN DIGEST"},
		{"QUERY WATCH ADD SQL TEXT EXACT TO 'x' SQL DIGEST 'y'", 1064, "near 'SQL DIGEST"},
		{"QUERY WATCH ADD SQL TEXT EXACT 'x'", 1064, "near ''x''"},
		{"QUERY WATCH ADD SQL TEXT EXACT TO x", 1064, "near 'x'"},
		{"QUERY WATCH ADD SQL TEXT FOO TO 'x'", 1064, "near 'FOO"},
		{"QUERY WATCH ADD SQL DIGEST x", 1064, "near 'x'"},
		{"QUERY WATCH ADD SQL FOO", 1064, "near 'FOO'"},
		{"QUERY WATCH ADD FOO", 1064, "near 'FOO'"},
		{"QUERY WATCH ADD RESOURCE GROUP rg1 ACTION SWITCH_GROUP(rg1) SQL DIGEST 'x'", 1105, "must differ"},
		{"QUERY WATCH ADD ACTION BOOM SQL DIGEST 'x'", 1064, "near 'BOOM"},
		{"QUERY WATCH REMOVE 0", 1105, "out of range"},
		{"QUERY WATCH REMOVE 99999999999999999999999", 1105, "out of range"},
		{"QUERY WATCH REMOVE rg1", 1064, "near 'rg1'"},
		{"QUERY WATCH LIST", 1064, "near 'LIST'"},
		{"QUERY WATCH", 1064, "near ''"},
		{"SELECT id FROM information_schema.runaway_watches", 1235, "runaway_watches"},
		{"SELECT * FROM information_schema.runaway_watches WHERE id = 1", 1235, "runaway_watches"},
	}
	for _, tt := range errs {
		_, err := Parse(tt.sql, sqltext.Mode{})
		var e *Error
		if !errors.As(err, &e) || e.Code != tt.code || !strings.Contains(e.Message, tt.msg) {
			t.Errorf("Parse(%s) = %v, want %d containing %q", tt.sql, err, tt.code, tt.msg)
		}
	}
}
