package tokenserver

import (
	"math"
	"time"

	"github.com/rgproxy/rgproxy/internal/topn"
)

// What rgserver's status console shows (cmd/rgserver serves it as
// /api/console): every group's settings, its global bucket, the proxies
// using it, and the rates of consumption and refusals they report.
//
// Reports are lumpy — a proxy that needs no tokens reports every 5 s, one
// that asks with every message — so a group's recent rate is kept per
// proxy (its slot), from the interval each message covers: consumption ÷
// time since the proxy's previous message for the group, averaged with a
// weight that follows that time (rateTau). A proxy silent for longer than
// a report period has consumed nothing since its last report (a
// consuming group reports at least every reportPeriod), so its rates fade
// then. The group's rate is the sum over its proxies.

// The rates a slot keeps: RU, statements, statements refused with 8252,
// statements refused otherwise, RU of the statements that waited.
const (
	rateRU = iota
	rateStatements
	rateThrottled
	rateRefused
	rateWaited
	numRates
)

const (
	// reportPeriod is the longest a proxy that consumes goes without
	// reporting (tokenclient's ReportPeriod, docs/design.md §7.2); a
	// slot's first message is taken to cover that much.
	reportPeriod = 5 * time.Second
	// rateTau is the time constant of a slot's rates: a report covering
	// dt weighs 1 − e^(−dt/rateTau), so a steady load reads right after
	// a report or two, and many small reports add up to what one large
	// one would.
	rateTau = 5 * time.Second
	// fadeTau is how fast a silent slot's rates fade once it missed its
	// report by a second.
	fadeTau = 2 * time.Second
)

// report folds one message's figures (what accrued since the proxy's
// previous message for the group) into the slot's rates at now.
func (s *slot) report(now time.Time, x [numRates]float64) {
	first := s.reportedAt.IsZero()
	dt := reportPeriod
	if !first {
		dt = now.Sub(s.reportedAt)
	}
	s.reportedAt = now
	sec := min(max(dt.Seconds(), 0.001), 60)
	w := 1 - math.Exp(-sec/rateTau.Seconds())
	for i, v := range x {
		if first {
			s.rates[i] = v / sec
		} else {
			s.rates[i] += w * (v/sec - s.rates[i])
		}
	}
}

// reported is the slot's rate i at now, faded when the proxy has been silent
// for longer than a report period and a second.
func (s *slot) reported(now time.Time, i int) float64 {
	r := s.rates[i]
	if quiet := now.Sub(s.reportedAt) - reportPeriod - time.Second; quiet > 0 && r != 0 {
		r *= math.Exp(-quiet.Seconds() / fadeTau.Seconds())
	}
	return r
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
	// RUPerSec, StatementsPerSec and ThrottledPerSec are what the
	// group's proxies report to this replica, per second, averaged over
	// about the last 5 s of their reports: RU consumed, statements run,
	// statements refused with 8252.
	RUPerSec, StatementsPerSec, ThrottledPerSec float64
	// RefusedPerSec and WaitedRUPerSec are the same for the statements
	// refused other than by 8252 (a budget's REFUSE) and the estimated RU
	// of the statements that waited for tokens: who is held back now.
	RefusedPerSec, WaitedRUPerSec float64
	// RU, Statements and Throttled are the same counted since this
	// replica first led (rgserver_ru_consumed_total,
	// rgserver_statements_total, rgserver_throttled_total).
	RU, Statements, Throttled float64
}

// InUse reports whether a proxy holds a slot in the group (it used the
// group within --client-expiry).
func (g *GroupOverview) InUse() bool { return g.Proxies > 0 }

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
	// TokenStreams and SettingsStreams are the AcquireTokens and settings
	// (rpc Watch) streams open on this replica: proxies connected to it.
	TokenStreams, SettingsStreams int64
	// Groups are the groups listed: those in use (GroupOverview.InUse),
	// most RU/s first, then the others by name, at most the limit asked.
	Groups []GroupOverview
	// Total is the number of groups this replica holds, InUse how many of
	// them are in use; Groups may list fewer.
	Total, InUse int
	// Credentials is what each credential took, reported and had dropped
	// or refused here, by name (credentials.go).
	Credentials []CredentialOverview
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
		SettingsStreams:    s.openStreams[kindSettings].Load(),
		Credentials:        s.creds.credentials(),
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
	for _, s := range b.slots {
		g.RUPerSec += s.reported(now, rateRU)
		g.StatementsPerSec += s.reported(now, rateStatements)
		g.ThrottledPerSec += s.reported(now, rateThrottled)
		g.RefusedPerSec += s.reported(now, rateRefused)
		g.WaitedRUPerSec += s.reported(now, rateWaited)
	}
	return g
}
