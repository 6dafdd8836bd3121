package tokenserver

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// FuzzTokenRequest feeds arbitrary stream messages to the validator and,
// when valid, to the leader's grant path: grants must stay finite and
// non-negative, and never exceed what was asked.
func FuzzTokenRequest(f *testing.F) {
	seed := func(r *pb.TokenRequest) {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&pb.TokenRequest{ProxyId: "p", RequestId: 1, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 100, DemandRuPerSec: 20}}})
	seed(&pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{Group: "default", TokensWanted: 1e300}, {Group: "g", ReportOnly: true, Consumption: &pb.Consumption{Rru: 1}}}})
	seed(&pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: math.NaN()}}})
	f.Add([]byte{0xff, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req pb.TokenRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		if err := validateTokenRequest(&req, ""); err != nil {
			return
		}
		s, err := New(nil, Config{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		s.alloc.SetGroup("g", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, t0)
		s.alloc.SetGroup("default", SettingsOf(resourcegroup.DefaultGroupDefinition()), t0)
		// Only known groups: unknown ones would go to etcd, which this
		// target has none of.
		known := req.Groups[:0]
		for _, g := range req.Groups {
			if n := resourcegroup.NormalizeName(g.Group); n == "g" || n == "default" {
				known = append(known, g)
			}
		}
		req.Groups = known
		resp := s.serveTokens(context.Background(), Principal{Role: RoleAdmin}, req.GetProxyId(), &req, newLookupBudget())
		for i, g := range resp.Grants {
			asked := req.Groups[i].TokensWanted
			if !finite(g.Tokens) || g.Tokens < 0 || g.Tokens > asked || !finite(g.FillRate) || g.FillRate < 0 {
				t.Fatalf("request %v got grant %v", req.Groups[i], g)
			}
		}
	})
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// FuzzAllocatorHostile drives one bucket with arbitrary numbers from
// several proxies, unvalidated (NaN, ±Inf, negatives, 1e308): every grant,
// share, level and sum must stay finite, every grant within what was
// asked, and the bucket's demand, held and level within their bounds; so
// must the usage and rates their reports add up to (after usageOf's
// bounds, as served).
func FuzzAllocatorHostile(f *testing.F) {
	f.Add(uint64(10), uint8(1), uint8(0), 1e308, 1e308, 1e15, false, uint16(100))
	f.Add(uint64(100), uint8(2), uint8(1), math.Inf(1), math.NaN(), math.Inf(-1), false, uint16(0))
	f.Add(uint64(1), uint8(0), uint8(2), 5.0, 1e-300, 3.0, true, uint16(2000))
	f.Add(uint64(math.MaxUint64), uint8(3), uint8(3), 1e308, 1e308, 1e308, false, uint16(1))
	f.Fuzz(func(t *testing.T, rate uint64, burst, proxy uint8, wanted, demand, held float64, report bool, ms uint16) {
		st := Settings{RUPerSec: max(rate, 1), Burst: resourcegroup.BurstMode(burst % 3)}
		if burst%4 == 3 {
			st.Mode = resourcegroup.ModeWarn
		}
		a := NewAllocator(AllocConfig{})
		a.SetGroup("g", st, t0)
		if ms%3 == 1 { // under a service limit too
			a.SetServiceLimit(float64(ms), t0)
		}
		now := t0
		ids := []string{"a", "b", "c", "d"}
		for i := 0; i < 12; i++ {
			req := Request{ProxyID: ids[(int(proxy)+i)%len(ids)], Wanted: wanted, Demand: demand, Held: held, ReportOnly: report && i%2 == 0}
			if i%3 == 1 { // an honest neighbour
				req = Request{ProxyID: "h", Wanted: 10, Demand: 2}
			}
			g, err := a.Acquire("g", req, now)
			if err != nil {
				t.Fatal(err)
			}
			if !finite(g.Tokens) || g.Tokens < 0 || !finite(g.FillRate) || g.FillRate < 0 || (finite(req.Wanted) && g.Tokens > max(req.Wanted, 0)) {
				t.Fatalf("step %d: %+v got %+v\n%s", i, req, g, a.Group("g").String(now))
			}
			b := a.Group("g")
			if !finite(b.Tokens(now)) || !finite(b.demand) || !finite(b.held) || !finite(b.reserved) || !finite(b.granted) {
				t.Fatalf("step %d: the bucket went non-finite\n%s", i, b.String(now))
			}
			if c, _ := a.Ceiling("g"); math.IsNaN(c) || c < 0 {
				t.Fatalf("step %d: ceiling %v", i, c)
			}
			if f := a.ServiceLimit(); !finite(f.Allocated) || !finite(f.Demand) || f.Allocated > f.Limit*(1+1e-9) {
				t.Fatalf("step %d: the service limit's figures %s", i, f)
			}
			if !st.Unlimited() && b.Tokens(now) > st.Capacity() {
				t.Fatalf("step %d: level %v over the capacity %v", i, b.Tokens(now), st.Capacity())
			}
			u, thr, _ := usageOf(&pb.Consumption{Rru: wanted, Wru: demand, BackendSeconds: held,
				Statements: uint64(ms) << 50, Throttled: math.MaxUint64 >> (i % 64)})
			a.Report("g", req.ProxyID, u, thr, 0, 0, now)
			o := b.overview(now)
			if !finite(o.RUPerSec) || !finite(o.StatementsPerSec) || !finite(o.ThrottledPerSec) || o.RUPerSec < 0 ||
				!finite(o.RU) || !finite(o.Throttled) {
				t.Fatalf("step %d: the group's usage went non-finite or negative: %+v", i, o)
			}
			now = now.Add(time.Duration(ms) * time.Millisecond)
		}
	})
}

// FuzzDecodeGroup feeds arbitrary etcd values to the group decoder: it must
// not panic, and a valid decoded group must survive a round trip.
func FuzzDecodeGroup(f *testing.F) {
	for _, g := range []resourcegroup.Group{
		resourcegroup.DefaultGroupDefinition(),
		{Name: "g", RUPerSec: 5, Priority: resourcegroup.PriorityLow, QueryLimit: &resourcegroup.QueryLimit{RU: 9, Action: resourcegroup.ActionDryRun}},
		budgetGroup("g"),
	} {
		b, err := encodeGroup(g)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"ru_per_sec":-1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := decodeGroup("g", data, 3)
		if err != nil || g.Validate() != nil {
			return
		}
		b, err := encodeGroup(g)
		if err != nil {
			t.Fatal(err)
		}
		g2, err := decodeGroup("g", b, 3)
		if err != nil {
			t.Fatal(err)
		}
		b2, _ := encodeGroup(g2)
		if string(b) != string(b2) {
			t.Fatalf("round trip changed %s into %s", b, b2)
		}
	})
}

// FuzzDecodeWatch feeds arbitrary etcd keys and values to the watch entry
// decoder: it must not panic, and a valid decoded entry must survive a
// round trip unchanged.
func FuzzDecodeWatch(f *testing.F) {
	b, err := encodeWatch(resourcegroup.Watch{Group: "g", Action: resourcegroup.ActionSwitchGroup, SwitchGroup: "h",
		Match: resourcegroup.WatchExact, Text: "select 1", Source: "manual",
		Created: time.UnixMilli(1000), Expires: time.UnixMilli(5000)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("7", b)
	f.Add("18446744073709551615", []byte(`{"group":"g","match":2,"text":"d"}`))
	f.Add("-1", []byte(`{"match":9}`))
	f.Fuzz(func(t *testing.T, id string, data []byte) {
		w, err := decodeWatch(keyWatches+id, data)
		if err != nil || w.Validate() != nil {
			return
		}
		if w.ID == 0 {
			t.Fatalf("decoded id 0 from key %q", id)
		}
		b, err := encodeWatch(w)
		if err != nil {
			t.Fatal(err)
		}
		w2, err := decodeWatch(watchKey(w.ID), b)
		if err != nil {
			t.Fatal(err)
		}
		if w2.ID != w.ID || !w2.Created.Equal(w.Created) || !w2.Expires.Equal(w.Expires) {
			t.Fatalf("round trip changed %+v into %+v", w, w2)
		}
		w.Created, w.Expires, w2.Created, w2.Expires = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if w != w2 {
			t.Fatalf("round trip changed %+v into %+v", w, w2)
		}
	})
}

// FuzzDecodeTagBinding: a stored tag binding never panics the decoder,
// and what decodes is stored back under a key that decodes the same.
func FuzzDecodeTagBinding(f *testing.F) {
	f.Add("route=%2Freport", []byte(`{"group":"rg"}`))
	f.Add("a%3Db=c+d", []byte(`{"group":"rg","host":"x"}`))
	f.Add("noequals", []byte(`{}`))
	f.Add("%zz=1", []byte(`{"group":1}`))
	f.Fuzz(func(t *testing.T, tag string, data []byte) {
		b, err := decodeTagBinding(tag, data)
		if err != nil {
			return
		}
		again, err := decodeTagBinding(resourcegroup.TagBindingKey(b.TagKey, b.TagValue), data)
		if err != nil || again != b {
			t.Fatalf("%q: %+v stored again decodes as %+v, %v", tag, b, again, err)
		}
	})
}

// FuzzDecodeDigestBinding: a stored digest binding never panics the
// decoder; what decodes is a valid digest in lower case, stored back
// under a key that decodes the same.
func FuzzDecodeDigestBinding(f *testing.F) {
	f.Add("00ab34cd56ef7890", []byte(`{"group":"rg"}`))
	f.Add("00AB34CD56EF7890", []byte(`{"group":"rg","host":"x"}`))
	f.Add("00ab", []byte(`{}`))
	f.Add("zzzzzzzzzzzzzzzz", []byte(`{"group":1}`))
	f.Fuzz(func(t *testing.T, digest string, data []byte) {
		b, err := decodeDigestBinding(digest, data)
		if err != nil {
			return
		}
		if resourcegroup.ValidateDigest(b.Digest) != nil || b.Digest != strings.ToLower(digest) || !b.IsDigest() || b.IsTag() {
			t.Fatalf("%q decodes as %+v", digest, b)
		}
		again, err := decodeDigestBinding(b.Digest, data)
		if err != nil || again != b {
			t.Fatalf("%q: %+v stored again decodes as %+v, %v", digest, b, again, err)
		}
	})
}
