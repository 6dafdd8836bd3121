package rgpolicy

import (
	"context"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
)

func TestParseChargebackKeys(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"", "", false},
		{"  ", "", false},
		{"application", "application", false},
		{" application , controller ", "application|controller", false},
		{"a,b,c,d,e,f,g,h", "a|b|c|d|e|f|g|h", false},
		{"a,b,c,d,e,f,g,h,i", "", true}, // more than 8
		{"application,application", "", true},
		{"application,", "", true}, // an empty key
		{"a=b", "", true},
		{"a'b", "", true},
		{"tab\there", "", true},
		{strings.Repeat("k", 65), "", true},
	} {
		keys, err := ParseChargebackKeys(tc.in)
		if (err != nil) != tc.wantErr || strings.Join(keys, "|") != tc.want {
			t.Errorf("ParseChargebackKeys(%q) = %q, %v; want %q, error %v", tc.in, keys, err, tc.want, tc.wantErr)
		}
	}
}

// The ledger attributes what it charges: per billed key and per account
// the sums equal the RU and statements the group was charged; a key's
// first value wins, the trailing comment before the leading one; keys
// not billed are not attributed.
func TestLedgerAttributesWhatItCharges(t *testing.T) {
	tok := testGroups()
	p := newTestPolicy(tok)
	set := p.CurrentSettings()
	set.ChargebackTagKeys = []string{"application", "controller"}
	p.Reload(set)
	s := p.Open(mysqlproto.SessionInfo{User: "app", ClientAddr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4000}})
	ctx := context.Background()
	for _, q := range []string{
		"SELECT 1 /*application='a1',controller='c1',route='r'*/",
		"/*application='ignored'*/ SELECT REPEAT('x', 5000) /*application='a2'*/",
		"/*controller='c2',application='a1'*/ SELECT 3",
		"SELECT 4 /*application='a1',application='second'*/",
		"SELECT 5 /*application='bad%01value'*/",
		"SELECT 6",
	} {
		st := query(q)
		if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
			t.Fatalf("%s: answered locally: %+v", q, v.Reply)
		}
		s.After(st, &mysqlproto.Outcome{RequestBytes: st.PayloadBytes, ResponseBytes: 2000, BackendTime: time.Millisecond})
	}
	acct := "bound app@10.1.2.3" // no binding looked up its host: the client's address
	if s.(*session).hostKnown {
		acct = "bound app@" + s.(*session).host
	}
	total := tok.billed[acct]
	if math.Abs(total-tok.ru) > 1e-9 || tok.billedStmts[acct] != 6 {
		t.Fatalf("account %s billed %.6f RU and %v statements; charged %.6f RU for 6 (%v)", acct, total, tok.billedStmts[acct], tok.ru, tok.billed)
	}
	sum := func(prefix string) (ru, n float64) {
		for k, v := range tok.billed {
			if strings.HasPrefix(k, prefix) {
				ru += v
				n += tok.billedStmts[k]
			}
		}
		return ru, n
	}
	if ru, n := sum("bound application="); n != 5 || ru >= total {
		t.Errorf("application billed %.6f RU for %v statements, want 5 of the 6 (%v)", ru, n, tok.billed)
	}
	for k, want := range map[string]float64{"application=a1": 3, "application=a2": 1, "application=\x00": 1,
		"controller=c1": 1, "controller=c2": 1, "route=r": 0, "application=second": 0, "application=ignored": 0} {
		if got := tok.billedStmts["bound "+k]; got != want {
			t.Errorf("%q billed %v statements, want %v", k, got, want)
		}
	}
}

// FuzzParseChargebackKeys: what --chargeback-tag-keys accepts is at most
// 8 distinct valid keys, and reads back the same when joined again.
func FuzzParseChargebackKeys(f *testing.F) {
	for _, s := range []string{"", "application,controller", " a , b ", "a,a", "a=b", "a,b,c,d,e,f,g,h,i", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := ParseChargebackKeys(s)
		if err != nil {
			return
		}
		if len(keys) > 8 {
			t.Fatalf("%q: %d keys", s, len(keys))
		}
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] || k == "" || len(k) > 64 || strings.ContainsAny(k, ",='\x00") {
				t.Fatalf("%q: key %q", s, k)
			}
			seen[k] = true
		}
		again, err := ParseChargebackKeys(strings.Join(keys, ","))
		if err != nil || strings.Join(again, ",") != strings.Join(keys, ",") {
			t.Fatalf("%q: %q read back as %q, %v", s, keys, again, err)
		}
	})
}
