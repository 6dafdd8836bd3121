package tokenclient

import (
	"context"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// The statement path through the client: AcquireShare before a statement
// and Charge (or ChargePurse) after it, on `default` (never throttled, so
// that the figures are the client's own work and its lock, not waits). A
// client that is not started: no stream takes the lock meanwhile.

var benchCons = ru.Consumption{RRU: 1.5, ReadBytes: 180, Statements: 1}

// BenchmarkAcquireCharge is one session's statements, without a purse.
func BenchmarkAcquireCharge(b *testing.B) {
	c, _ := newTestClient(b, nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.AcquireShare(ctx, nil, resourcegroup.DefaultGroup, benchCons, 1, time.Second); err != nil {
			b.Fatal(err)
		}
		c.Charge(resourcegroup.DefaultGroup, ru.Consumption{RRU: 0.1})
	}
}

// BenchmarkAcquireChargeParallel is many sessions at once, without purses:
// every statement takes the groups' lock twice.
func BenchmarkAcquireChargeParallel(b *testing.B) {
	c, _ := newTestClient(b, nil)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := c.AcquireShare(ctx, nil, resourcegroup.DefaultGroup, benchCons, 1, time.Second); err != nil {
				b.Error(err)
				return
			}
			c.Charge(resourcegroup.DefaultGroup, ru.Consumption{RRU: 0.1})
		}
	})
}

// BenchmarkAcquirePurseParallel is many sessions at once, each with its
// purse, as rgpolicy runs them.
func BenchmarkAcquirePurseParallel(b *testing.B) { benchPurse(b, false, nil) }

// BenchmarkAcquirePurseAttributeParallel is BenchmarkAcquirePurseParallel
// with each statement's chargeback, as rgpolicy's ledger attributes it: to
// an account and a tag (the groups' lock once more per statement), or to
// the account alone (kept in the purse).
func BenchmarkAcquirePurseAttributeParallel(b *testing.B) {
	b.Run("tag", func(b *testing.B) { benchPurse(b, true, []BilledTag{{Key: "application", Value: "app07"}}) })
	b.Run("account", func(b *testing.B) { benchPurse(b, true, nil) })
}

// benchPurse runs sessions with purses in parallel, each statement
// settled in its purse and, with attribute, billed to tags and an account.
func benchPurse(b *testing.B, attribute bool, tags []BilledTag) {
	c, _ := newTestClient(b, nil)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		p := &Purse{}
		defer c.ReturnPurse(p)
		for pb.Next() {
			if _, _, err := c.AcquireShare(ctx, p, resourcegroup.DefaultGroup, benchCons, 1, time.Second); err != nil {
				b.Error(err)
				return
			}
			c.ChargePurse(p, resourcegroup.DefaultGroup, ru.Consumption{RRU: 0.1})
			if attribute {
				c.Attribute(p, resourcegroup.DefaultGroup, tags, "app@%", benchCons)
			}
		}
	})
}
