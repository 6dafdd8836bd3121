package tokenserver

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestProxyRegistry: a credential holds at most MaxStreams proxy ids; a
// new id replaces one whose stream ended (its slots are to be dropped),
// never a live one; an id coming back takes itself over.
func TestProxyRegistry(t *testing.T) {
	r := newProxyRegistry(time.Minute)
	px := Principal{Name: "px", Role: RoleProxy, MaxStreams: 2}
	type held struct {
		t       *streamTicket
		release func(time.Time)
	}
	live := map[string]held{}
	bind := func(sec float64, id string, wantEvict []string, wantErr bool) {
		t.Helper()
		tk, evict, release, err := r.bind(px, id, at(sec))
		if wantErr {
			if !errors.Is(err, errStreamLimit) {
				t.Fatalf("bind %s at %vs: %v, want errStreamLimit", id, sec, err)
			}
			return
		}
		if err != nil || !slices.Equal(evict, wantEvict) {
			t.Fatalf("bind %s at %vs: evict %v, %v; want evict %v", id, sec, evict, err, wantEvict)
		}
		live[id] = held{tk, release}
	}
	bind(0, "a", nil, false)
	bind(0, "b", nil, false)
	bind(1, "c", nil, true) // a and b stream
	// a comes back on a new stream: the old one is superseded.
	old := live["a"]
	bind(2, "a", nil, false)
	if !old.t.superseded.Load() || live["a"].t.superseded.Load() {
		t.Fatal("the new stream of a should supersede the old one, only")
	}
	old2 := live["a"]
	// The superseded stream's end does not free the id.
	old.release(at(2))
	bind(3, "c", nil, true)
	// b's stream ends: c takes its place, b's slots go.
	live["b"].release(at(4))
	bind(5, "c", []string{"px/b"}, false)
	// Once a's stream ends and its slots have expired, d needs no eviction.
	old2.release(at(6))
	bind(6+60, "d", nil, false)
	bind(70, "e", nil, true) // c and d stream

	// An unbounded principal is never refused nor tracked.
	admin := Principal{Name: "admin", Role: RoleAdmin}
	for i := range 100 {
		if _, evict, _, err := r.bind(admin, string(rune('A'+i)), t0); err != nil || evict != nil {
			t.Fatal(err)
		}
	}
	if _, ok := r.creds["admin"]; ok {
		t.Fatal("an unbounded credential should not be tracked")
	}

	// Open streams: MaxStreams + 1 of one kind at once.
	var closes []func()
	for range 3 {
		c, err := r.open(px, kindTokens)
		if err != nil {
			t.Fatal(err)
		}
		closes = append(closes, c)
	}
	if _, err := r.open(px, kindTokens); !errors.Is(err, errStreamLimit) {
		t.Fatalf("4th stream: %v", err)
	}
	if c, err := r.open(px, kindSettings); err != nil {
		t.Fatalf("a watch counts apart: %v", err)
	} else {
		c()
	}
	closes[0]()
	if c, err := r.open(px, kindTokens); err != nil {
		t.Fatalf("after one closed: %v", err)
	} else {
		c()
	}
}

func TestSlotID(t *testing.T) {
	if got := slotID(Principal{}, "host:4000"); got != "host:4000" {
		t.Fatalf("open: %q", got)
	}
	if got := slotID(Principal{Name: "px", Role: RoleProxy}, "host:4000"); got != "px/host:4000" {
		t.Fatalf("named: %q", got)
	}
}

func TestMissCacheAndLookupBudget(t *testing.T) {
	c := newMissCache()
	c.add("x", at(0))
	if !c.has("x", at(1)) || c.has("x", at(2)) || c.has("y", at(0)) {
		t.Fatal("a miss lives missTTL")
	}
	c.add("x", at(3))
	c.forget("x")
	if c.has("x", at(3)) {
		t.Fatal("forget")
	}
	for i := range missCacheMax + 10 {
		c.add(string(rune(i+256)), at(10))
	}
	if len(c.expires) != missCacheMax {
		t.Fatalf("cache holds %d, at most %d", len(c.expires), missCacheMax)
	}
	c.add("late", at(20)) // the full cache's entries have expired: room again
	if !c.has("late", at(20)) || len(c.expires) != 1 {
		t.Fatalf("after expiry: %d entries", len(c.expires))
	}

	b := newLookupBudget()
	n := 0
	for b.take(at(0)) {
		n++
	}
	if n != unknownLookupBurst {
		t.Fatalf("burst %d, want %d", n, unknownLookupBurst)
	}
	n = 0
	for b.take(at(1)) {
		n++
	}
	if n != unknownLookupRate {
		t.Fatalf("after 1 s: %d, want %d", n, unknownLookupRate)
	}
}
