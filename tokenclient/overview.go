package tokenclient

import (
	"time"

	"github.com/rgproxy/rgproxy/internal/topn"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Overview: every group this proxy knows, with its definition and its
// live state here, for rgproxy's status console (cmd/rgproxy serves it
// as /api/console through rgpolicy.Policy.Overview).

// GroupOverview is one group as this proxy sees it.
type GroupOverview struct {
	// Definition is the group's definition from the settings cache
	// (default's built-in one until rgserver sends one). Defined is false
	// for a group used here that the cache no longer holds (dropped a
	// moment ago): Definition is then the zero Group with its name.
	Definition resourcegroup.Group
	Defined    bool
	// InUse: the group has state on this proxy — used since the proxy
	// started, or since it was last forgotten as idle
	// (--group-idle-expiry). The figures below are 0 for the others.
	InUse bool
	// RUPerSec and StatementsPerSec are the RU consumed and statements
	// charged per second on this proxy over the last 10 s (SHOW RESOURCE
	// GROUP USAGE's RU_PER_SEC_LAST_10S).
	RUPerSec, StatementsPerSec float64
	// Tokens is what the local bucket holds (negative: debt); meaningless
	// when Unlimited.
	Tokens float64
	// Unlimited: the group is never throttled (UNLIMITED, MODE WARN or
	// OFF).
	Unlimited bool
	// Throttled counts the statements refused with 8252 here since the
	// group's state was made (rgproxy_throttled_total).
	Throttled uint64
	// Proxies is how many proxies use the group and ShareRate this
	// proxy's share of its RU_PER_SEC in RU/s, as the last grant said; 0
	// before the first.
	Proxies   uint32
	ShareRate float64
}

// Overview is what this proxy knows of its groups at one moment.
type Overview struct {
	// Groups are the groups listed: those in use here, most RU/s first,
	// then the others by name; at most the limit asked for.
	Groups []GroupOverview
	// Total is the number of groups known (the settings cache and those in
	// use here), InUse how many are in use here; Groups may list fewer.
	Total, InUse int
	// Degraded: no grant from rgserver lately; buckets refill locally.
	Degraded bool
	// Connected: the token stream is open and has answered.
	Connected bool
	// Revision is the etcd revision the settings cache is at.
	Revision int64
}

// overviewChunk is how many groups Overview looks at per hold of the
// groups' lock, so that statements never wait for a walk over 100,000
// groups.
const overviewChunk = 1024

// Overview returns every group this proxy knows, listing at most limit of
// them: those in use here first, by RU/s, then the others by name. It
// keeps only the groups it lists, and releases the groups' lock every
// overviewChunk groups (a group created, used or forgotten meanwhile may
// or may not be counted).
func (c *Client) Overview(now time.Time, limit int) Overview {
	used := topn.New(limit, func(a, b GroupOverview) bool {
		if a.RUPerSec != b.RUPerSec {
			return a.RUPerSec > b.RUPerSec
		}
		return a.Definition.Name < b.Definition.Name
	})
	idle := topn.New(limit, func(a, b GroupOverview) bool { return a.Definition.Name < b.Definition.Name })
	var o Overview
	o.Revision = c.cache.revision()
	inUse := map[string]bool{}
	c.groups.mu.Lock()
	c.groups.refreshLocked(now)
	o.Degraded, o.Connected = c.groups.degraded, c.stream.status().connected
	n := 0
	for name, gs := range c.groups.byName {
		g := GroupOverview{InUse: true, Tokens: gs.bucket.Tokens(now), Unlimited: gs.bucket.Unlimited(),
			Throttled: gs.throttled, Proxies: gs.proxies, ShareRate: gs.shareRate}
		g.Definition, g.Defined = c.cache.definition(name)
		g.Definition.Name = name
		g.RUPerSec, g.StatementsPerSec = gs.usage.rates(now)
		used.Offer(g)
		inUse[name] = true
		o.Total++
		o.InUse++
		if n++; n%overviewChunk == 0 {
			c.groups.mu.Unlock()
			c.groups.mu.Lock()
		}
	}
	c.groups.mu.Unlock()
	// The groups defined and not in use, from the cache alone (its own
	// lock: the grants do not wait for this walk).
	c.cache.read(func(snap *snapshot) {
		for name, def := range snap.Groups {
			if !inUse[name] {
				idle.Offer(GroupOverview{Definition: def, Defined: true, Unlimited: isUnlimited(def)})
				o.Total++
			}
		}
		if _, ok := snap.Groups[resourcegroup.DefaultGroup]; !ok && !inUse[resourcegroup.DefaultGroup] {
			// default exists before rgserver sends it.
			def := resourcegroup.DefaultGroupDefinition()
			idle.Offer(GroupOverview{Definition: def, Defined: true, Unlimited: isUnlimited(def)})
			o.Total++
		}
	})
	o.Groups = used.Sorted()
	for _, g := range idle.Sorted() {
		if len(o.Groups) >= limit {
			break
		}
		o.Groups = append(o.Groups, g)
	}
	for i := range o.Groups {
		o.Groups[i].Definition = o.Groups[i].Definition.Clone()
	}
	return o
}
