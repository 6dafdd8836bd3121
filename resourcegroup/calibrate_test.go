package resourcegroup

import (
	"slices"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestParseCalibrate(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(calibrateTimeLayout, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		sql  string
		want CalibrateResource
	}{
		{"CALIBRATE RESOURCE", CalibrateResource{}},
		{"calibrate resource;", CalibrateResource{}},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '10m'",
			CalibrateResource{Window: true, Start: at("2026-11-28 10:00:00"), End: at("2026-11-28 10:10:00")}},
		{"CALIBRATE RESOURCE START_TIME = '2026-11-28 10:00:00' END_TIME = '2026-11-28 12:00:00'",
			CalibrateResource{Window: true, Start: at("2026-11-28 10:00:00"), End: at("2026-11-28 12:00:00")}},
		{"CALIBRATE RESOURCE START_TIME \"2026-11-28 10:00:00\"",
			CalibrateResource{Window: true, Start: at("2026-11-28 10:00:00")}},
		{"CALIBRATE RESOURCE FOR GROUPS", CalibrateResource{ForGroups: true}},
		{"CALIBRATE RESOURCE FOR GROUPS (a, `B`, a) START_TIME '2026-11-28 10:00:00' DURATION '1h'",
			CalibrateResource{ForGroups: true, Groups: []string{"a", "b"}, Window: true, Start: at("2026-11-28 10:00:00"), End: at("2026-11-28 11:00:00")}},
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
			got, ok := st.(*CalibrateResource)
			if !ok {
				t.Fatalf("Parse = %#v", st)
			}
			if got.Window != tt.want.Window || !got.Start.Equal(tt.want.Start) || !got.End.Equal(tt.want.End) ||
				got.ForGroups != tt.want.ForGroups || !slices.Equal(got.Groups, tt.want.Groups) {
				t.Errorf("Parse = %+v, want %+v", *got, tt.want)
			}
			if RequiresSuper(st) {
				t.Error("CALIBRATE reads; it needs no SUPER")
			}
		})
	}
}

func TestParseCalibrateErrors(t *testing.T) {
	tests := []parseErrorCase{
		{"CALIBRATE RESOURCE WORKLOAD = TPCC", 1235, "CALIBRATE RESOURCE WORKLOAD: rgproxy measures"},
		{"CALIBRATE RESOURCE WORKLOAD OLTP_READ_WRITE", 1235, "use CALIBRATE RESOURCE or CALIBRATE RESOURCE START_TIME"},
		{"CALIBRATE RESOURCES", 1064, "expected RESOURCE"},
		{"CALIBRATE RESOURCE DURATION '10m'", 1064, "needs START_TIME before it"},
		{"CALIBRATE RESOURCE START_TIME 1700000000", 1064, "START_TIME is a quoted 'YYYY-MM-DD HH:MM:SS' (UTC)"},
		{"CALIBRATE RESOURCE START_TIME '2026-13-45 10:00:00'", 1105, "START_TIME '2026-13-45 10:00:00' is not a time"},
		{"CALIBRATE RESOURCE START_TIME '1960-01-01 00:00:00'", 1105, "from 1970"},
		{"CALIBRATE RESOURCE START_TIME ''' OR 1=1; DROP TABLE t; -- '", 1105, "is not a time"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '10'", 1105, "DURATION '10' is not a duration"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '30s'", 1105, "too short"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '-1h'", 1105, "too short"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '2562047h'", 1105, "longer than the usage history's 400 days"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION '99999999999999999999h'", 1105, "is not a duration"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' END_TIME '2026-11-28 09:00:00'", 1105, "too short"},
		{"CALIBRATE RESOURCE START_TIME '2026-11-28 10:00:00' DURATION 10m", 1064, "DURATION is a quoted duration"},
		{"CALIBRATE RESOURCE FOR GROUPS ()", 1064, "expected a resource group name"},
		{"CALIBRATE RESOURCE FOR GROUPS (a, 'b')", 1064, "not the string"},
		{"CALIBRATE RESOURCE FOR GROUPS (a b)", 1064, "expected ')'"},
		{"CALIBRATE RESOURCE FOR GROUP (a)", 1064, "expected GROUPS"},
		{"CALIBRATE RESOURCE FOR GROUPS (a) WORKLOAD = TPCC", 1064, "expected START_TIME or the end of the statement"},
		{"CALIBRATE RESOURCE NOW", 1064, "expected START_TIME, FOR GROUPS, WORKLOAD or the end of the statement"},
		{"CALIBRATE RESOURCE; SELECT 1", 1295, ""},
	}
	checkParseErrors(t, tests)
}
