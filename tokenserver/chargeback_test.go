package tokenserver

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func TestValidChargeEntry(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *pb.ChargebackEntry
		want bool
	}{
		{"a tag", &pb.ChargebackEntry{TagKey: "app", TagValue: "a", Rru: 1, Statements: 1}, true},
		{"a tag's other", &pb.ChargebackEntry{TagKey: "app", Other: true, Wru: 1}, true},
		{"an account", &pb.ChargebackEntry{Account: "u@%", Rru: 1}, true},
		{"the accounts' other", &pb.ChargebackEntry{Other: true, Rru: 1}, true},
		{"an empty value is a value", &pb.ChargebackEntry{TagKey: "app", Rru: 1}, true},
		{"other with a value", &pb.ChargebackEntry{TagKey: "app", TagValue: "a", Other: true}, false},
		{"other with an account", &pb.ChargebackEntry{Account: "u@%", Other: true}, false},
		{"tag and account", &pb.ChargebackEntry{TagKey: "app", TagValue: "a", Account: "u@%"}, false},
		{"a value without key", &pb.ChargebackEntry{TagValue: "a"}, false},
		{"no account", &pb.ChargebackEntry{Rru: 1}, false},
		{"a long value", &pb.ChargebackEntry{TagKey: "app", TagValue: strings.Repeat("v", 65)}, false},
		{"a long key", &pb.ChargebackEntry{TagKey: strings.Repeat("k", 65), TagValue: "v"}, false},
		{"a long account", &pb.ChargebackEntry{Account: strings.Repeat("u", 161)}, false},
		{"a key with '='", &pb.ChargebackEntry{TagKey: "a=b", TagValue: "v"}, false},
		{"a NUL in a value", &pb.ChargebackEntry{TagKey: "app", TagValue: "a\x00b"}, false},
		{"the other marker as a value", &pb.ChargebackEntry{TagKey: "app", TagValue: chargeOther}, false},
		{"not UTF-8", &pb.ChargebackEntry{Account: "u\xff@%"}, false},
		{"negative", &pb.ChargebackEntry{Account: "u@%", Rru: -1}, false},
		{"NaN", &pb.ChargebackEntry{Account: "u@%", Wru: math.NaN()}, false},
		{"infinite", &pb.ChargebackEntry{Account: "u@%", Rru: math.Inf(1)}, false},
		{"too large", &pb.ChargebackEntry{Account: "u@%", Rru: 2 * maxReportRU}, false},
		{"too many statements", &pb.ChargebackEntry{Account: "u@%", Statements: 1 << 62}, false},
	} {
		if got := validChargeEntry(tc.e); got != tc.want {
			t.Errorf("%s: valid %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The first chargebackTopN values of a group's key in an hour are named,
// later ones not; a new hour starts again; a group names at most
// chargebackMaxKeys keys an hour; the accounts do not count as a key.
func TestChargeAdmit(t *testing.T) {
	var a chargeAdmit
	now := t0.Add(10 * time.Minute)
	for i := range chargebackTopN {
		if named, ok := a.admit("g", "app", fmt.Sprint(i), now); !named || !ok {
			t.Fatalf("value %d not named", i)
		}
	}
	if named, ok := a.admit("g", "app", "late", now); named || !ok {
		t.Fatalf("value %d named (%v %v)", chargebackTopN, named, ok)
	}
	if named, _ := a.admit("g", "app", "0", now.Add(40*time.Minute)); !named {
		t.Fatal("a named value is not named again")
	}
	if named, _ := a.admit("other", "app", "late", now); !named {
		t.Fatal("another group's bound is shared")
	}
	if named, _ := a.admit("g", "app", "late", now.Add(time.Hour)); !named {
		t.Fatal("a new hour names nothing new")
	}
	for i := range chargebackMaxKeys - 1 {
		if _, ok := a.admit("g", fmt.Sprint("k", i), "v", now.Add(time.Hour)); !ok {
			t.Fatalf("key %d refused", i)
		}
	}
	if _, ok := a.admit("g", "one too many", "v", now.Add(time.Hour)); ok {
		t.Fatal("a ninth key admitted")
	}
	if named, ok := a.admit("g", "", "u@%", now.Add(time.Hour)); !named || !ok {
		t.Fatal("an account refused with the keys full")
	}
}

func TestChargeNames(t *testing.T) {
	for _, tc := range []struct {
		group, key, value string
		other             bool
	}{
		{"g", "app", "a", false},
		{"g", "app", "", false},
		{"g", "app", "", true},
		{"g", "", "u@%", false},
		{"g", "", "", true},
	} {
		name := chargeName(tc.group, tc.key, tc.value, tc.other)
		p, ok := parseChargeName(name)
		if !ok || p != (chargePart{tc.group, tc.key, tc.value, tc.other}) || seriesGroup(name) != tc.group {
			t.Errorf("%+v: %q read back as %+v (%v)", tc, name, p, ok)
		}
	}
	if _, ok := parseChargeName("plain"); ok {
		t.Error("a group's series read as chargeback")
	}
}

// FuzzParseChargeName: a series name read as chargeback is written back
// as itself.
func FuzzParseChargeName(f *testing.F) {
	f.Add("g\x00t\x00app\x00v")
	f.Add("g\x00a\x00u@%")
	f.Add("g\x00t\x00app\x00\x01")
	f.Add("g\x00x")
	f.Fuzz(func(t *testing.T, name string) {
		p, ok := parseChargeName(name)
		if !ok {
			return
		}
		if back := chargeName(p.group, p.key, p.value, p.other); back != name {
			t.Fatalf("%q read as %+v, written back as %q", name, p, back)
		}
	})
}

// reportChargeback records each entry over the seconds of the group's
// report, names the first 32 values of an hour and sums the rest as
// other, scales by the credential book's bound, drops malformed entries;
// the group's own history does not show the parts.
func TestReportChargeback(t *testing.T) {
	s := &Server{usage: loadedHistory(t0), chargeDropped: newChargeDropped()}
	now := t0.Add(30 * time.Minute)
	var entries []*pb.ChargebackEntry
	for i := range 40 {
		entries = append(entries, &pb.ChargebackEntry{TagKey: "app", TagValue: fmt.Sprintf("a%02d", i), Rru: 1, Statements: 1})
	}
	entries = append(entries,
		&pb.ChargebackEntry{Account: "u@%", Rru: 30, Statements: 30},
		&pb.ChargebackEntry{Other: true, Rru: 10, Statements: 10},
		&pb.ChargebackEntry{TagKey: "app", TagValue: "bad\x00", Rru: 1e6},
		&pb.ChargebackEntry{Account: "v@%", Rru: math.NaN()})
	c := &pb.Consumption{Rru: 40, Statements: 40, Chargeback: entries}
	// The credential book let half of the RRU count.
	s.usage.addUntil("g", usageFigs(20, 0, 40), 2*time.Second, now, now)
	s.reportChargeback("g", usageFigs(20, 0, 40), c, 2*time.Second, 0, now)

	if got := rowsOf(s.usage, usageSec, t0, now.Add(time.Minute), t0); !strings.HasPrefix(got, "g@") || strings.Contains(got, "a0") {
		t.Errorf("the group's history shows %s", got)
	}
	sum := func(accounts bool) (named int, other, total float64) {
		rows, _ := s.usage.queryCharge(map[string]bool{"g": true}, accounts, usageMin, 0, math.MaxInt64, maxUsageRows)
		for _, r := range rows {
			if r.part.other {
				other += r.p.v[figRRU]
			} else {
				named++
			}
			total += r.p.v[figRRU]
		}
		return named, other, total
	}
	if named, other, total := sum(false); named != 32 || math.Abs(other-4) > 1e-9 || math.Abs(total-20) > 1e-9 {
		t.Errorf("by tag: %d named, %v RU other, %v RU in all; want 32, 4 and 20", named, other, total)
	}
	if named, other, total := sum(true); named != 1 || math.Abs(other-5) > 1e-9 || math.Abs(total-20) > 1e-9 {
		t.Errorf("by account: %d named, %v RU other, %v RU in all; want 1, 5 and 20", named, other, total)
	}
	if rows, _ := s.usage.queryCharge(map[string]bool{"h": true}, false, usageMin, 0, math.MaxInt64, maxUsageRows); len(rows) != 0 {
		t.Errorf("another group's rows: %v", rows)
	}
	if got := testutil.ToFloat64(s.chargeDropped); got != 2 {
		t.Errorf("%v entries dropped, want 2", got)
	}
}
