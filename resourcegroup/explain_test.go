package resourcegroup

import (
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestParseExplain(t *testing.T) {
	tests := []struct {
		sql  string
		want ExplainGroup
	}{
		{"EXPLAIN RESOURCE GROUP rg", ExplainGroup{Name: "rg", Last: time.Hour}},
		{"explain resource group `RG` with (ru_per_sec = 200, burstable = off) for last 7 days;",
			ExplainGroup{Name: "rg", With: Group{RUPerSec: 200, Burst: BurstOff}, Fields: FieldRUPerSec | FieldBurst, Last: 7 * 24 * time.Hour}},
		{"EXPLAIN RESOURCE GROUP rg WITH (BURSTABLE) FOR LAST 1 MINUTE",
			ExplainGroup{Name: "rg", With: Group{Burst: BurstModerated}, Fields: FieldBurst, Last: time.Minute}},
		{"EXPLAIN RESOURCE GROUP rg FOR LAST 90 SECONDS", ExplainGroup{Name: "rg", Last: 90 * time.Second}},
		{"EXPLAIN RESOURCE GROUP rg WITH (RU_PER_SEC = UNLIMITED) FOR LAST 400 DAYS",
			ExplainGroup{Name: "rg", With: Group{RUPerSec: Unlimited}, Fields: FieldRUPerSec, Last: 400 * 24 * time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.sql, func(t *testing.T) {
			if !IsAdmin(tt.sql, sqltext.Mode{}) {
				t.Error("IsAdmin is false")
			}
			st, err := Parse(tt.sql, sqltext.Mode{})
			if err != nil {
				t.Fatal(err)
			}
			got, ok := st.(*ExplainGroup)
			if !ok {
				t.Fatalf("Parse = %#v", st)
			}
			if got.Name != tt.want.Name || got.Fields != tt.want.Fields || got.Last != tt.want.Last ||
				got.With.RUPerSec != tt.want.With.RUPerSec || got.With.Burst != tt.want.With.Burst {
				t.Errorf("Parse = %+v, want %+v", *got, tt.want)
			}
			if RequiresSuper(st) {
				t.Error("a what-if needs SUPER; it reads a group's history as SHOW CREATE reads its definition")
			}
		})
	}
}

func TestParseExplainErrors(t *testing.T) {
	tests := []parseErrorCase{
		{"EXPLAIN RESOURCE GROUP", 1064, "expected a resource group name"},
		{"EXPLAIN RESOURCE rg", 1064, "expected GROUP"},
		{"EXPLAIN RESOURCE GROUP rg WITH ()", 1064, "expected a proposed RU_PER_SEC, BURSTABLE or BUDGET"},
		{"EXPLAIN RESOURCE GROUP rg WITH (PRIORITY = HIGH)", 1064, "proposes RU_PER_SEC, BURSTABLE and BUDGET only"},
		{"EXPLAIN RESOURCE GROUP rg WITH (RU_PER_SEC = 0)", 1105, "RU_PER_SEC = 0 is out of range"},
		{"EXPLAIN RESOURCE GROUP rg WITH (RU_PER_SEC = 5", 1064, "expected ')'"},
		{"EXPLAIN RESOURCE GROUP rg FOR 7 DAYS", 1064, "expected LAST"},
		{"EXPLAIN RESOURCE GROUP rg FOR LAST 0 DAYS", 1105, "FOR LAST 0 is not a whole number from 1"},
		{"EXPLAIN RESOURCE GROUP rg FOR LAST 99999999999 DAYS", 1105, "not a whole number from 1"},
		{"EXPLAIN RESOURCE GROUP rg FOR LAST 401 DAYS", 1105, "beyond the usage history's 400 days"},
		{"EXPLAIN RESOURCE GROUP rg FOR LAST 7 WEEKS", 1064, "takes SECONDS, MINUTES, HOURS or DAYS, not 'WEEKS'"},
		{"EXPLAIN RESOURCE GROUP rg FOR LAST DAYS", 1064, "takes a whole number"},
		{"EXPLAIN RESOURCE GROUP rg junk", 1064, "expected WITH (...), FOR LAST or the end of the statement, not 'junk'"},
	}
	checkParseErrors(t, tests)
}
