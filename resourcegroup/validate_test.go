package resourcegroup

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestErrorCodes(t *testing.T) {
	tests := []struct {
		name  string
		err   *Error
		code  uint16
		state string
		is    error
		msg   string
	}{
		{"exists", NewExists("x"), 8248, "HY000", ErrExists, "Resource group 'x' already exists"},
		{"not found", NewNotFound("x"), 8249, "HY000", ErrNotFound, "Unknown resource group 'x'"},
		{"syntax", NewSyntax("CREATE RESOURCE GROUP", 7), 1064, "42000", ErrSyntax, "near 'RESOURCE GROUP' at line 1"},
		{"syntax line 2", NewSyntax("SELECT\n  1 foo", 11), 1064, "42000", ErrSyntax, "near 'foo' at line 2"},
		{"syntax clamps", NewSyntax("x", 99), 1064, "42000", ErrSyntax, "near '' at line 1"},
		{"syntax negative", NewSyntax("x", -1), 1064, "42000", ErrSyntax, "near 'x' at line 1"},
		{"denied", NewAccessDenied(), 1227, "42000", ErrAccessDenied, "Access denied; you need (at least one of) the SUPER privilege(s) for this operation"},
		{"invalid", NewInvalid("invalid exec elapsed time"), 1105, "HY000", ErrInvalid, "invalid exec elapsed time"},
		{"unsupported", NewUnsupported("X"), 1235, "42000", ErrUnsupported, "This version of rgproxy doesn't yet support 'X'"},
		{"prepare", NewNotAllowedInPrepare(), 1295, "HY000", ErrNotAllowedInPrepare, "This command is not supported in the prepared statement protocol yet"},
		{"conflict", NewConflict("x", 3, 4), 1105, "HY000", ErrConflict, "modified concurrently"},
		{"drop reserved", NewDropReserved(), 1105, "HY000", ErrInvalid, "can't drop reserved resource group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error = tt.err
			if !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.is)
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != tt.code || e.State != tt.state {
				t.Errorf("got %d %s, want %d %s", e.Code, e.State, tt.code, tt.state)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("message %q does not contain %q", err.Error(), tt.msg)
			}
		})
	}
	if got := NewSyntax(strings.Repeat("x", 79)+"é", 0).Message; !strings.Contains(got, "'"+strings.Repeat("x", 79)+"'") {
		t.Errorf("near text splits a character: %q", got)
	}
	long := strings.Repeat("x", 200)
	if got := NewSyntax(long, 0).Message; !strings.Contains(got, "'"+strings.Repeat("x", 80)+"'") {
		t.Errorf("near text not cut at 80: %q", got)
	}
}

func TestValidate(t *testing.T) {
	ql := func(q QueryLimit) *QueryLimit { return &q }
	tests := []struct {
		name string
		g    Group
		want string // "" = valid; else a substring of the 1105 message
	}{
		{"default", DefaultGroupDefinition(), ""},
		{"plain", Group{Name: "rg1", RUPerSec: 1}, ""},
		{"32 chars", Group{Name: strings.Repeat("a", 32), RUPerSec: 1}, ""},
		{"32 runes", Group{Name: strings.Repeat("é", 32), RUPerSec: 1}, ""},
		{"33 chars", Group{Name: strings.Repeat("a", 33), RUPerSec: 1}, "resource group name too long"},
		{"empty name", Group{RUPerSec: 1}, "resource group name is empty"},
		{"upper case", Group{Name: "RG", RUPerSec: 1}, "not in lower case"},
		{"bad utf8", Group{Name: "a\xff", RUPerSec: 1}, "not valid UTF-8"},
		{"zero RU", Group{Name: "rg", RUPerSec: 0}, "unknown resource group mode"},
		{"bad priority", Group{Name: "rg", RUPerSec: 1, Priority: 9}, "unknown PRIORITY"},
		{"bad burst", Group{Name: "rg", RUPerSec: 1, Burst: 9}, "unknown BURSTABLE"},
		{"limit ok", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, Watch: WatchExact, WatchDuration: time.Minute})}, ""},
		{"limit RU ok", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{RU: 10, Action: ActionCooldown})}, ""},
		{"limit empty", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{Action: ActionKill})}, "QUERY_LIMIT needs a limit"},
		{"limit negative", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: -1, Action: ActionKill})}, "invalid exec elapsed time"},
		{"limit both", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, RU: 1, Action: ActionKill})}, "only one of EXEC_ELAPSED and RU"},
		{"no action", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1})}, "unknown resource group runaway action"},
		{"bad action", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: 42})}, "unknown resource group runaway action"},
		{"switch ok", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionSwitchGroup, SwitchGroup: "other"})}, ""},
		{"switch self", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionSwitchGroup, SwitchGroup: "rg"})}, "must differ"},
		{"switch empty", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionSwitchGroup})}, "switch group name"},
		{"switch upper", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionSwitchGroup, SwitchGroup: "X"})}, "not in lower case"},
		{"switch target w/o action", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionKill, SwitchGroup: "x"})}, "only allowed with ACTION=SWITCH_GROUP"},
		{"duration w/o watch", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionKill, WatchDuration: 1})}, "DURATION needs WATCH"},
		{"negative duration", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionKill, Watch: WatchSimilar, WatchDuration: -1})}, "must not be negative"},
		{"bad watch", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionKill, Watch: 7})}, "unknown WATCH"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.g.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrInvalid) || e.Code != 1105 {
				t.Fatalf("Validate() = %#v, want a 1105 ErrInvalid", err)
			}
			if !strings.Contains(e.Message, tt.want) {
				t.Errorf("message %q does not contain %q", e.Message, tt.want)
			}
		})
	}
}

func TestNormalizeName(t *testing.T) {
	for in, want := range map[string]string{"RG1": "rg1", "Default": "default", "ÉTÉ": "été", "x": "x"} {
		if got := NormalizeName(in); got != want {
			t.Errorf("NormalizeName(%q) = %q, want %q", in, got, want)
		}
	}
}
