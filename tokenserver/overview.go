package tokenserver

import (
	"time"

	"github.com/rgproxy/rgproxy/internal/topn"
)

// What rgserver's status console shows (cmd/rgserver serves it as
// /api/console): every group's settings, its global bucket, the proxies
// using it, and the consumption and refusals proxies reported to this
// replica over the last recentWindow seconds.

// recentWindow is the span, in seconds, of a group's recent rates, as
// SHOW RESOURCE GROUP USAGE's on a proxy. Proxies report a consuming
// group at least every 5 s, so a shorter window would show their reports'
// steps rather than a rate.
const recentWindow = 10

// recentUsage sums a group's reports in one-second slots over the last
// recentWindow seconds: O(1) per report, 128 bytes per group in use.
type recentUsage struct {
	sec   int64 // Unix second of the newest slot
	slots [recentWindow]struct{ ru, statements, throttled float32 }
}

// advance brings the ring to now's second, emptying the slots it passes.
func (r *recentUsage) advance(now time.Time) {
	s := now.Unix()
	if s <= r.sec {
		return
	}
	if s-r.sec >= recentWindow {
		r.slots = [recentWindow]struct{ ru, statements, throttled float32 }{}
	} else {
		for i := r.sec + 1; i <= s; i++ {
			r.slots[i%recentWindow] = struct{ ru, statements, throttled float32 }{}
		}
	}
	r.sec = s
}

func (r *recentUsage) add(now time.Time, ru, statements, throttled float64) {
	r.advance(now)
	if now.Unix() != r.sec {
		return // older than the newest slot: a clock step back
	}
	sl := &r.slots[r.sec%recentWindow]
	sl.ru += float32(ru)
	sl.statements += float32(statements)
	sl.throttled += float32(throttled)
}

// rates returns RU, statements and refusals per second over the window
// that ends at now.
func (r *recentUsage) rates(now time.Time) (ru, statements, throttled float64) {
	r.advance(now)
	for _, sl := range r.slots {
		ru += float64(sl.ru)
		statements += float64(sl.statements)
		throttled += float64(sl.throttled)
	}
	return ru / recentWindow, statements / recentWindow, throttled / recentWindow
}

// idle reports whether nothing was reported within the window that ends
// at now.
func (r *recentUsage) idle(now time.Time) bool {
	r.advance(now)
	for _, sl := range r.slots {
		if sl.ru != 0 || sl.statements != 0 || sl.throttled != 0 {
			return false
		}
	}
	return true
}

// GroupOverview is one group as this replica sees it.
type GroupOverview struct {
	// Name is the group's name.
	Name string
	// Settings are its RU_PER_SEC, BURSTABLE and MODE.
	Settings Settings
	// Limited: the group can be throttled (not UNLIMITED, MODE ENFORCE);
	// Tokens and Capacity are meaningful only then.
	Limited bool
	// Tokens is what the global bucket holds now (negative: promised to
	// running trickles); Capacity the most it holds, in RU.
	Tokens, Capacity float64
	// Proxies is the number of proxies holding a live slot in the group.
	Proxies int
	// RUPerSec, StatementsPerSec and ThrottledPerSec are what proxies
	// reported to this replica over the last 10 s, per second: RU
	// consumed, statements run, statements refused with 8252.
	RUPerSec, StatementsPerSec, ThrottledPerSec float64
	// RU, Statements and Throttled are the same counted since this
	// replica first led (rgserver_ru_consumed_total,
	// rgserver_statements_total, rgserver_throttled_total).
	RU, Statements, Throttled float64
}

// InUse reports whether a proxy holds a slot in the group or reported
// something about it within the last 10 s.
func (g *GroupOverview) InUse() bool {
	return g.Proxies > 0 || g.RUPerSec > 0 || g.StatementsPerSec > 0 || g.ThrottledPerSec > 0
}

// Overview is what this replica knows of the cluster at one moment.
type Overview struct {
	// At is when it was taken.
	At time.Time
	// Leader: this replica leads; LeaderAddr is the leader's advertised
	// address ("" while unknown). Only the leader hears proxies' reports
	// and holds their slots: a follower's figures are its settings and
	// whatever it counted while it led.
	Leader     bool
	LeaderAddr string
	// Etcd says why etcd refuses writes, "" when it does not (EtcdProblem).
	Etcd string
	// GrantingFromMemory: the leader's etcd session lapsed; it grants on.
	GrantingFromMemory bool
	// Insecure: no authentication is configured.
	Insecure bool
	// TokenStreams and WatchStreams are the AcquireTokens and Watch
	// streams open on this replica: proxies connected to it.
	TokenStreams, WatchStreams int64
	// Groups are the groups listed: those in use (GroupOverview.InUse),
	// most RU/s first, then the others by name, at most the limit asked.
	Groups []GroupOverview
	// Total is the number of groups this replica holds, InUse how many of
	// them are in use; Groups may list fewer.
	Total, InUse int
}

// Overview returns what this replica knows of every group, listing at
// most limit groups (in use first, by RU/s; then by name). It walks the
// groups a chunk at a time (walkGroups), so grants never wait for it, and
// keeps only the groups it lists: with 100,000 groups it costs a walk,
// not a copy.
func (s *Server) Overview(limit int) Overview {
	now := s.now()
	o := Overview{
		At:                 now,
		Leader:             s.IsLeader(),
		LeaderAddr:         s.LeaderAddr(),
		Etcd:               s.EtcdProblem(),
		GrantingFromMemory: s.orphan.Load(),
		Insecure:           s.Insecure(),
		TokenStreams:       s.openStreams[kindTokens].Load(),
		WatchStreams:       s.openStreams[kindWatch].Load(),
	}
	used := topn.New(limit, func(a, b GroupOverview) bool {
		if a.RUPerSec != b.RUPerSec {
			return a.RUPerSec > b.RUPerSec
		}
		return a.Name < b.Name
	})
	idle := topn.New(limit, func(a, b GroupOverview) bool { return a.Name < b.Name })
	s.walkGroups(func(b *Bucket) {
		g := b.overview(now)
		o.Total++
		if g.InUse() {
			o.InUse++
			used.Offer(g)
		} else {
			idle.Offer(g)
		}
	})
	o.Groups = used.Sorted()
	for _, g := range idle.Sorted() {
		if len(o.Groups) >= limit {
			break
		}
		o.Groups = append(o.Groups, g)
	}
	return o
}

// overview is the bucket's GroupOverview at now; the grant lock is held.
func (b *Bucket) overview(now time.Time) GroupOverview {
	g := GroupOverview{
		Name: b.name, Settings: b.settings, Limited: !b.settings.Unlimited(), Proxies: len(b.slots),
		RU: b.usage.RU(), Statements: b.usage.Statements, Throttled: b.throttled,
	}
	if g.Limited {
		g.Tokens, g.Capacity = b.Tokens(now), b.settings.Capacity()
	}
	if b.recent != nil {
		g.RUPerSec, g.StatementsPerSec, g.ThrottledPerSec = b.recent.rates(now)
	}
	return g
}
