package resourcegroup

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/sqltext"
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
		{"denied", NewAccessDenied(""), 1227, "42000", ErrAccessDenied, "Access denied; you need (at least one of) the SUPER privilege(s) for this operation"},
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
		// Validate checks a name only as a reference (ValidateName): a
		// group stored under the old rule can still be altered.
		{"legacy name", Group{Name: "a b\u202e'", RUPerSec: 1}, ""},
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
		{"limit both", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, RU: 1, Action: ActionKill})}, "only one of EXEC_ELAPSED and RU"},
		{"no action", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second})}, "unknown resource group runaway action"},
		{"bad action", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: 42})}, "unknown resource group runaway action"},
		{"switch ok", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionSwitchGroup, SwitchGroup: "other"})}, ""},
		{"switch self", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionSwitchGroup, SwitchGroup: "rg"})}, "must differ"},
		{"switch empty", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionSwitchGroup})}, "switch group name"},
		{"switch upper", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionSwitchGroup, SwitchGroup: "X"})}, "not in lower case"},
		{"switch target w/o action", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, SwitchGroup: "x"})}, "only allowed with ACTION=SWITCH_GROUP"},
		{"duration w/o watch", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, WatchDuration: 1})}, "DURATION needs WATCH"},
		{"negative duration", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, Watch: WatchSimilar, WatchDuration: -1})}, "DURATION = '-1ns' is out of range"},
		{"duration at max", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, Watch: WatchSimilar, WatchDuration: MaxWatchDuration})}, ""},
		{"duration over max", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, Watch: WatchSimilar, WatchDuration: MaxWatchDuration + time.Millisecond})}, "DURATION is 1ms to 8760h in whole milliseconds, or UNLIMITED"},
		{"duration in µs", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, Watch: WatchSimilar, WatchDuration: 1500 * time.Microsecond})}, "not a whole number of milliseconds"},
		{"elapsed 1ns", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: 1, Action: ActionKill})}, "EXEC_ELAPSED = '1ns' is out of range; EXEC_ELAPSED is 1ms to 168h"},
		{"elapsed 1ms", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Millisecond, Action: ActionKill})}, ""},
		{"elapsed at max", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: MaxExecElapsed, Action: ActionKill})}, ""},
		{"elapsed over max", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: MaxExecElapsed + time.Millisecond, Action: ActionKill})}, "EXEC_ELAPSED = '168h0m0.001s' is out of range"},
		{"limit RU at max", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{RU: MaxRU, Action: ActionKill})}, ""},
		{"limit RU over max", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{RU: MaxRU + 1, Action: ActionKill})}, "QUERY_LIMIT RU = 1000000000000001 is out of range; QUERY_LIMIT RU is 1 to 1000000000000000"},
		{"RU_PER_SEC at max", Group{Name: "rg", RUPerSec: MaxRU}, ""},
		{"RU_PER_SEC over max", Group{Name: "rg", RUPerSec: MaxRU + 1}, "RU_PER_SEC = 1000000000000001 is out of range; RU_PER_SEC is 1 to 1000000000000000, or UNLIMITED"},
		{"MAX_CONCURRENCY at max", Group{Name: "rg", RUPerSec: 1, MaxConcurrency: MaxConcurrencyCap}, ""},
		{"MAX_CONCURRENCY over max", Group{Name: "rg", RUPerSec: 1, MaxConcurrency: MaxConcurrencyCap + 1}, "MAX_CONCURRENCY = 100001 is out of range; MAX_CONCURRENCY is 0 to 100000"},
		{"bad watch", Group{Name: "rg", RUPerSec: 1, QueryLimit: ql(QueryLimit{ExecElapsed: time.Second, Action: ActionKill, Watch: 7})}, "unknown WATCH"},
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

// ValidateNewName is the rule for a group being created; ValidateName, for
// a name that refers to a group, keeps the looser rule of earlier versions
// so that a group stored under it stays usable and can be dropped.
func TestValidateNewName(t *testing.T) {
	tests := []struct {
		name      string
		newErr    string // "" = a valid new name
		legacyErr string // "" = a valid reference
	}{
		{"rg1", "", ""},
		{"RG_1$x", "", ""},
		{strings.Repeat("a", 32), "", ""},
		{"été", "", ""},
		{"組1", "", ""},
		{"e\u0301", "", ""}, // a combining mark
		{"123", "", ""},
		{strings.Repeat("é", 16), "", ""},
		{strings.Repeat("é", 17), "has 34 bytes; a resource group name is 1 to 32 bytes", ""},
		{strings.Repeat("a", 33), "has 33 bytes", "resource group name too long"},
		{"", "resource group name is empty; a resource group name is 1 to 32 bytes", "resource group name is empty"},
		{"a b", "holds U+0020 at character 2", ""},
		{"a\x00", "holds U+0000 at character 2", ""},
		{"a\nb", "holds U+000A at character 2", ""},
		{"\u202eab", "holds U+202E at character 1", ""},
		{"a\u2066", "holds U+2066", ""},
		{"a\u200e", "holds U+200E", ""},
		{"a\u200b", "holds U+200B", ""},
		{"a'b", "holds ''' (U+0027)", ""},
		{"a\"b", "holds '\"' (U+0022)", ""},
		{"a`b", "holds '`' (U+0060)", ""},
		{`a\b`, `holds '\' (U+005C)`, ""},
		{"a-b", "holds '-' (U+002D)", ""},
		{"a.b", "holds '.' (U+002E)", ""},
		{"a\xff", "not valid UTF-8", "not valid UTF-8"},
	}
	for _, tt := range tests {
		check := func(what string, err error, want string) {
			t.Helper()
			if want == "" {
				if err != nil {
					t.Errorf("%s(%q) = %v, want nil", what, tt.name, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s(%q) = %v, want ErrInvalid containing %q", what, tt.name, err, want)
			}
		}
		check("ValidateNewName", ValidateNewName(tt.name), tt.newErr)
		check("ValidateName", ValidateName(tt.name), tt.legacyErr)
		if tt.newErr != "" && tt.legacyErr == "" {
			g := Group{Name: NormalizeName(tt.name), RUPerSec: 1}
			if err := g.Validate(); err != nil {
				t.Errorf("Validate of a legacy group %q: %v", tt.name, err)
			}
			if err := g.ValidateNew(); err == nil {
				t.Errorf("ValidateNew of %q: nil", tt.name)
			}
			// The SQL: such a group can be named, not created.
			q := QuoteName(tt.name)
			for _, sql := range []string{"DROP RESOURCE GROUP " + q, "ALTER RESOURCE GROUP " + q + " RU_PER_SEC = 5",
				"SET RESOURCE GROUP " + q, "ALTER USER u RESOURCE GROUP " + q, "SHOW CREATE RESOURCE GROUP " + q} {
				if _, err := Parse(sql, sqltext.Mode{}); err != nil {
					t.Errorf("Parse(%q) = %v", sql, err)
				}
			}
			if _, err := Parse("CREATE RESOURCE GROUP "+q+" RU_PER_SEC = 5", sqltext.Mode{}); !errors.Is(err, ErrInvalid) {
				t.Errorf("CREATE of %q: %v, want ErrInvalid", tt.name, err)
			}
		}
	}
}

// ValidateNewTag refuses control, format and line-separator characters;
// ValidateTag, the rule for reading and dropping, does not.
func TestValidateNewTag(t *testing.T) {
	tests := []struct{ key, value, want string }{
		{"route", "/report", ""},
		{"db.driver", "go 1.26 (linux)", ""},
		{"k", "", ""},
		{"k", `a'b\c"`, ""},
		{"k", "中文", ""},
		{"k", "a\u202eb", "the tag value holds U+202E at character 2"},
		{"k", "\u2067", "U+2067"},
		{"k", "a\x00", "U+0000"},
		{"k", "a\nb", "U+000A"},
		{"k", "a\u2028", "U+2028"},
		{"k\x1b", "v", "the tag key holds U+001B at character 2"},
		{"k", "\ufeff", "U+FEFF"},
		{"", "v", "the tag key is empty"},
	}
	for _, tt := range tests {
		err := ValidateNewTag(tt.key, tt.value)
		if tt.want == "" {
			if err != nil {
				t.Errorf("ValidateNewTag(%q, %q) = %v", tt.key, tt.value, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ValidateNewTag(%q, %q) = %v, want %q", tt.key, tt.value, err, tt.want)
		}
		if tt.key != "" && ValidateTag(tt.key, tt.value) != nil {
			t.Errorf("ValidateTag(%q, %q) refuses a tag that may be stored", tt.key, tt.value)
		}
	}
}
