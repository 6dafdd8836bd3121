package tokenclient

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// entryString is an entry as "key=value:ru/statements" ("acct@h:..." for
// an account, "key=*" or "*" for other).
func entryString(e *tokenpb.ChargebackEntry) string {
	name := e.GetTagKey() + "=" + e.GetTagValue()
	if e.GetTagKey() == "" {
		name = e.GetAccount()
	}
	if e.GetOther() {
		name = strings.TrimSuffix(name, e.GetTagValue()) + "*"
	}
	return fmt.Sprintf("%s:%g/%d", name, e.GetRru()+e.GetWru(), e.GetStatements())
}

func TestChargeAccTopNAndOther(t *testing.T) {
	one := func(ru float64) chargeFig { return chargeFig{rru: ru, stmts: 1} }
	for _, tc := range []struct {
		name string
		add  func(a *chargeAcc)
		want []string // the entries, in order
	}{
		{"nothing", func(*chargeAcc) {}, nil},
		{"tags and account", func(a *chargeAcc) {
			a.add([]BilledTag{{"app", "a"}, {"ctl", "c"}}, "u@%", one(2))
			a.add([]BilledTag{{"app", "b"}}, "u@%", one(3))
			a.add([]BilledTag{{"app", "a"}}, "v@%", one(1))
		}, []string{"app=a:3/2", "app=b:3/1", "ctl=c:2/1", "u@%:5/2", "v@%:1/1"}},
		{"a value that is not UTF-8 or holds a control character is other", func(a *chargeAcc) {
			a.add([]BilledTag{{"app", "x\x01y"}}, "", one(1))
			a.add([]BilledTag{{"app", "\xff"}}, "", one(1))
			a.add([]BilledTag{{"app", "ok"}}, "", one(1))
		}, []string{"app=ok:1/1", "app=*:2/2"}},
		{"a long value is cut", func(a *chargeAcc) {
			a.add([]BilledTag{{"app", strings.Repeat("é", 100)}}, "", one(1))
		}, []string{"app=" + strings.Repeat("é", 32) + ":1/1"}},
		{"beyond the top 32 by RU: other", func(a *chargeAcc) {
			for i := range 40 {
				a.add([]BilledTag{{"app", fmt.Sprintf("v%02d", i)}}, fmt.Sprintf("u%02d@%%", i), one(float64(100-i)))
			}
		}, func() []string {
			var w []string
			for i := range 32 {
				w = append(w, fmt.Sprintf("app=v%02d:%d/1", i, 100-i))
			}
			w = append(w, "app=*:"+fmt.Sprint(68+67+66+65+64+63+62+61)+"/8")
			for i := range 32 {
				w = append(w, fmt.Sprintf("u%02d@%%:%d/1", i, 100-i))
			}
			return append(w, "*:"+fmt.Sprint(68+67+66+65+64+63+62+61)+"/8")
		}()},
		{"more keys than billed are dropped", func(a *chargeAcc) {
			var tags []BilledTag
			for i := range 10 {
				tags = append(tags, BilledTag{fmt.Sprintf("k%d", i), "v"})
			}
			a.add(tags, "", one(1))
		}, []string{"k0=v:1/1", "k1=v:1/1", "k2=v:1/1", "k3=v:1/1", "k4=v:1/1", "k5=v:1/1", "k6=v:1/1", "k7=v:1/1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a chargeAcc
			tc.add(&a)
			var got []string
			for _, e := range a.take() {
				got = append(got, entryString(e))
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("entries\n%v\nwant\n%v", got, tc.want)
			}
			if !a.empty() {
				t.Fatal("take left something")
			}
		})
	}
}

// A report rgserver did not take is put back: the next one carries it
// with what came since.
func TestChargeAccRestore(t *testing.T) {
	var a chargeAcc
	a.add([]BilledTag{{"app", "a"}}, "u@%", chargeFig{rru: 1, wru: 2, stmts: 1})
	sent := a.take()
	a.add([]BilledTag{{"app", "a"}}, "u@%", chargeFig{rru: 1, stmts: 1})
	a.restore(sent)
	var got []string
	for _, e := range a.take() {
		got = append(got, entryString(e))
	}
	if want := "app=a:4/2 u@%:4/2"; strings.Join(got, " ") != want {
		t.Fatalf("entries %v, want %s", got, want)
	}
}

// Hostile tag values — many, long — hold at most chargebackHeld values of
// at most ChargebackValueBytes per key between two reports, and a report
// carries at most ChargebackTopN and other; the sums are kept.
func TestChargeAccHostileValuesAreBounded(t *testing.T) {
	var a chargeAcc
	long := strings.Repeat("x", 100_000)
	const n = 20_000
	for i := range n {
		a.add([]BilledTag{{"app", fmt.Sprintf("%05d", i) + long}}, fmt.Sprintf("u%05d@%s", i, long), chargeFig{rru: 1, stmts: 1})
	}
	if got := len(a.tags["app"].vals); got != chargebackHeld {
		t.Fatalf("%d values held, want %d", got, chargebackHeld)
	}
	if got := len(a.accounts.vals); got != chargebackHeld {
		t.Fatalf("%d accounts held, want %d", got, chargebackHeld)
	}
	held := 0
	for v := range a.tags["app"].vals {
		held = max(held, len(v))
	}
	for v := range a.accounts.vals {
		if len(v) > ChargebackAccountBytes {
			t.Fatalf("an account of %d bytes held", len(v))
		}
	}
	if held > ChargebackValueBytes {
		t.Fatalf("a value of %d bytes held", held)
	}
	entries := a.take()
	var tagRU, acctRU float64
	for _, e := range entries {
		if e.GetTagKey() != "" {
			tagRU += e.GetRru()
		} else {
			acctRU += e.GetRru()
		}
	}
	if len(entries) != 2*(ChargebackTopN+1) || math.Abs(tagRU-n) > 1e-6 || math.Abs(acctRU-n) > 1e-6 {
		t.Fatalf("%d entries (want %d), %v RU by tag and %v by account (want %d)", len(entries), 2*(ChargebackTopN+1), tagRU, acctRU, n)
	}
}

func TestChargebackAccount(t *testing.T) {
	for _, tc := range []struct{ user, host, want string }{
		{"app", "%", "app@%"},
		{"app", "10.0.0.1", "app@10.0.0.1"},
		{"b\xffad", "h", "b\uFFFDad@h"},
		{strings.Repeat("u", 300), "h", strings.Repeat("u", ChargebackAccountBytes)},
	} {
		if got := ChargebackAccount(tc.user, tc.host); got != tc.want {
			t.Errorf("ChargebackAccount(%q, %q) = %q, want %q", tc.user, tc.host, got, tc.want)
		}
	}
}
