package resourcegroup

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

var fuzzSeeds = []string{
	"CREATE RESOURCE GROUP IF NOT EXISTS rg1 RU_PER_SEC = 500 PRIORITY = HIGH BURSTABLE QUERY_LIMIT = (EXEC_ELAPSED = '60s', ACTION = SWITCH_GROUP(rg2), WATCH = SIMILAR DURATION = '10m');",
	"create resource group `a``b` ru_per_sec=unlimited burstable=unlimited query_limit=(ru=5 action=kill watch=exact duration=unlimited)",
	"ALTER RESOURCE GROUP rg1 RU_PER_SEC = 800 QUERY_LIMIT=NULL",
	"CREATE RESOURCE GROUP b RU_PER_SEC = 500 BUDGET = (RU = 2000000 PER DAY, ON 80 PERCENT NOTIFY, ON 100 PERCENT THROTTLE (RU_PER_SEC = 50)) BUDGET = (RU = 50000000 PER MONTH, ON 100 PERCENT REFUSE)",
	"create resource group b ru_per_sec=unlimited budget (ru 1 per hour on 1 percent notify on 2 percent refuse) budget=(ru=9 per week)",
	"ALTER RESOURCE GROUP b BUDGET = (RU = 7 PER HOUR), BUDGET PER MONTH = NULL",
	"ALTER RESOURCE GROUP b BUDGET = NULL",
	"DROP RESOURCE GROUP IF EXISTS rg1",
	"ALTER USER 'app'@'%' RESOURCE GROUP rg1",
	"ALTER USER app IDENTIFIED BY 'RESOURCE GROUP'",
	"CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO rg1",
	"DROP RESOURCE GROUP BINDING IF EXISTS FOR TAG `k` = 'v'",
	"CREATE RESOURCE GROUP binding RU_PER_SEC = 1",
	"CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890' TO rg1",
	"DROP RESOURCE GROUP BINDING IF EXISTS FOR DIGEST 'FFFFFFFFFFFFFFFF'",
	"CREATE GLOBAL BINDING FOR SELECT a FROM t JOIN u USING (id) USING SELECT /*+ RESOURCE_GROUP(rg) */ a FROM t JOIN u USING (id)",
	"DROP GLOBAL BINDING FOR SQL DIGEST '00ab34cd56ef7890'",
	"SET RESOURCE GROUP rg1",
	"SELECT CURRENT_RESOURCE_GROUP()",
	"SHOW CREATE RESOURCE GROUP rg1",
	"SELECT name FROM information_schema.resource_groups WHERE NAME = 'rg1'",
	"SHOW RESOURCE GROUP USAGE",
	"SHOW CLUSTER RESOURCE GROUP USAGE WHERE THROTTLED > 0",
	"SHOW LAST STATEMENT RU",
	"EXPLAIN RESOURCE GROUP rg1 WITH (RU_PER_SEC = 200, BURSTABLE = OFF) FOR LAST 7 DAYS",
	"CALIBRATE RESOURCE",
	"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '10m'",
	"calibrate resource for groups (a, `b`) start_time = '2026-11-28 10:00:00' end_time = '2026-11-29 10:00:00'",
	"CALIBRATE RESOURCE WORKLOAD = TPCC",
	"/* c */ -- x\n# y\nSELECT /*+ RESOURCE_GROUP(rg1) */ 1",
	"/*!40101 SET NAMES utf8 */",
	"select 'a\\'b' from t",
	"",
}

// FuzzParse: Parse never panics; IsAdmin accepts whatever Parse accepts;
// any CREATE that parses, and any ALTER applied to a group with budgets
// that validates, renders to text that parses back to the same group.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		st, err := Parse(sql, sqltext.Mode{})
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("Parse(%q) error %T is not *Error", sql, err)
			}
			return
		}
		if !IsAdmin(sql, sqltext.Mode{}) {
			t.Fatalf("Parse(%q) succeeded but IsAdmin is false", sql)
		}
		var g Group
		switch s := st.(type) {
		case *CreateGroup:
			g = s.Group
			if err := g.Validate(); err != nil {
				t.Fatalf("Parse(%q) returned an invalid group: %v", sql, err)
			}
		case *CalibrateResource:
			// A window that parses is within its bounds; names are valid.
			if s.Window && !s.End.IsZero() {
				if d := s.End.Sub(s.Start); d < CalibrateMinWindow || d > CalibrateMaxWindow {
					t.Fatalf("Parse(%q): window of %s", sql, d)
				}
			}
			if len(s.Groups) > calibrateMaxGroups || s.Window && s.Start.Year() < 1970 {
				t.Fatalf("Parse(%q) = %+v", sql, s)
			}
			for _, n := range s.Groups {
				if ValidateName(n) != nil {
					t.Fatalf("Parse(%q): group %q", sql, n)
				}
			}
			return
		case *AlterGroup:
			g = s.Apply(fuzzAlterBase(s.Name))
			if g.Validate() != nil {
				return // e.g. a THROTTLE not below the base's RU_PER_SEC: Execute refuses it
			}
			if ValidateNewName(g.Name) != nil {
				// A group stored under the older name rule can be altered,
				// but its SHOW CREATE no longer replays (docs/sql.md).
				return
			}
		case *CreateDigestBinding:
			checkParsedDigest(t, sql, s.Digest)
			return
		case *DropDigestBinding:
			checkParsedDigest(t, sql, s.Digest)
			return
		case *StmtBinding:
			for _, u := range s.Usings {
				if u[0] < 0 || u[1] > len(s.Text) || !eqFold(s.Text[u[0]:u[1]], "USING") {
					t.Fatalf("Parse(%q): USING at %v in %q", sql, u, s.Text)
				}
			}
			s.Splits()
			return
		default:
			return
		}
		text := g.SQL()
		st2, err := Parse(text, sqltext.Mode{})
		if err != nil {
			t.Fatalf("reparse of %q (from %q): %v", text, sql, err)
		}
		g.Version = 0
		if c2, ok := st2.(*CreateGroup); !ok || !reflect.DeepEqual(c2.Group, g) {
			t.Fatalf("round trip of %q: %#v != %#v", sql, st2, g)
		}
	})
}

// checkParsedDigest fails unless a parsed digest binding's digest is what
// bindings keep: 16 lower-case hex digits that round-trip through
// ParseDigest and FormatDigest.
func checkParsedDigest(t *testing.T, sql, d string) {
	t.Helper()
	h, err := ParseDigest(d)
	if err != nil || FormatDigest(h) != d {
		t.Fatalf("Parse(%q) returned the digest %q: ParseDigest %x, %v", sql, d, h, err)
	}
}

// FuzzDigest: ValidateDigest accepts exactly 16 hex digits, and what it
// accepts is the hash FormatDigest writes back in lower case.
func FuzzDigest(f *testing.F) {
	for _, s := range []string{"00ab34cd56ef7890", "FFFFFFFFFFFFFFFF", "0x00000000000000", "+0000000000000001", "", "g", "0000000000000000\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, d string) {
		hexDigits := len(d) == DigestLength && strings.Trim(d, "0123456789abcdefABCDEF") == ""
		h, err := ParseDigest(d)
		if (err == nil) != hexDigits {
			t.Fatalf("ParseDigest(%q) = %v; 16 hex digits: %v", d, err, hexDigits)
		}
		if err != nil {
			if e, ok := err.(*Error); !ok || e.Code != CodeUnknown {
				t.Fatalf("ParseDigest(%q) error %#v is not 1105", d, err)
			}
			return
		}
		if FormatDigest(h) != strings.ToLower(d) {
			t.Fatalf("FormatDigest(ParseDigest(%q)) = %q", d, FormatDigest(h))
		}
	})
}

// fuzzAlterBase is the group FuzzParse's ALTERs change: every kind of
// option set, and budgets to replace, keep and remove.
func fuzzAlterBase(name string) Group {
	return Group{Name: name, RUPerSec: 1000, Priority: PriorityHigh, Burst: BurstModerated, Mode: ModeWarn, MaxConcurrency: 3,
		QueryLimit: &QueryLimit{RU: 5, Action: ActionKill},
		Budgets: []Budget{
			{Period: PeriodDay, RU: 100, Triggers: []BudgetTrigger{{Percent: 50, Action: BudgetNotify}, {Percent: 90, Action: BudgetThrottle, ThrottleRUPerSec: 10}}},
			{Period: PeriodMonth, RU: 1000, Triggers: []BudgetTrigger{{Percent: 100, Action: BudgetRefuse}}},
		}}
}

// FuzzIsAdmin: IsAdmin never panics and agrees with Parse.
func FuzzIsAdmin(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		admin := IsAdmin(sql, sqltext.Mode{})
		if _, err := Parse(sql, sqltext.Mode{}); err == nil && !admin {
			t.Fatalf("Parse(%q) succeeded but IsAdmin is false", sql)
		}
	})
}

// FuzzHint: the single pass and HintGroup never panic, and return a
// normalized name that occurs in the query, only for a query that has a
// hint comment.
func FuzzHint(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Add("UPDATE /*+ a() RESOURCE_GROUP(`X y`) */ t SET a=1")
	f.Fuzz(func(t *testing.T, q string) {
		name, ok := hintOf(t, q)
		if !ok {
			if name != "" {
				t.Fatalf("hint of %q = %q without ok", q, name)
			}
			return
		}
		if name == "" || name != NormalizeName(name) {
			t.Fatalf("hint of %q = %q, not a normalized name", q, name)
		}
		if !strings.Contains(q, "/*+") || !strings.Contains(strings.ToLower(q), strings.ToLower(name)) && !strings.Contains(NormalizeName(q), name) {
			t.Fatalf("hint of %q = %q, not from a hint in the query", q, name)
		}
	})
}
