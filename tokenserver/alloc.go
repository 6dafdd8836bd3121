package tokenserver

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// ErrUnknownGroup is returned by Allocator.Acquire for a group it does not hold.
var ErrUnknownGroup = errors.New("tokenserver: unknown resource group")

// firstTrickle is the length of a new slot's first trickle.
const firstTrickle = time.Second

// Defaults of AllocConfig.
const (
	DefaultTargetPeriod  = 5 * time.Second
	DefaultTricklePeriod = 2 * time.Second
	DefaultClientExpiry  = 60 * time.Second
)

// AllocConfig tunes the Allocator.
type AllocConfig struct {
	// TargetPeriod is the period a proxy sizes its requests for: it
	// converts tokens wanted into a demand in RU/s when a request carries
	// none, and spreads a proxy's share of the bucket's tokens. Default 5 s.
	TargetPeriod time.Duration
	// TricklePeriod is how long a trickle grant lasts: its tokens are to
	// be spent evenly over it. Shares take effect as running trickles end
	// (the fill is never reserved twice), so a short period lets a changed
	// split converge quickly; it costs one request per period per
	// throttled group and proxy. Default 2 s.
	TricklePeriod time.Duration
	// ClientExpiry is how long a proxy's slot lives after its last request;
	// a vanished proxy stops holding a share after it. Default 60 s.
	ClientExpiry time.Duration
}

func (c AllocConfig) withDefaults() AllocConfig {
	if c.TargetPeriod <= 0 {
		c.TargetPeriod = DefaultTargetPeriod
	}
	if c.TricklePeriod <= 0 {
		c.TricklePeriod = DefaultTricklePeriod
	}
	if c.ClientExpiry <= 0 {
		c.ClientExpiry = DefaultClientExpiry
	}
	return c
}

// Settings is what the allocator needs of a group's definition.
type Settings struct {
	// RUPerSec is the fill rate in RU/s, or resourcegroup.Unlimited.
	RUPerSec uint64
	// Burst is the BURSTABLE mode; it sets the bucket's capacity.
	Burst resourcegroup.BurstMode
	// Version is the definition's etcd ModRevision, echoed in grants.
	Version int64
	// Mode: a WARN or OFF group is granted what it asks, as an unlimited
	// one (its proxies meter it and, in WARN, record what ENFORCE would
	// have done).
	Mode resourcegroup.Mode
	// Priority orders the groups under the service limit
	// (servicelimit.go): a higher level's demand is met first.
	Priority resourcegroup.Priority
	// Parent is the group whose RU_PER_SEC holds over this group and
	// its siblings together (parents.go); "" = none.
	Parent string
	// Background is BACKGROUND's UTILIZATION_LIMIT in percent (0: a
	// foreground group): under the service limit its RU_PER_SEC comes
	// first and beyond it only what the foreground leaves
	// (servicelimit.go).
	Background uint8
}

// SettingsOf extracts the allocator's settings from a definition.
func SettingsOf(g resourcegroup.Group) Settings {
	return Settings{RUPerSec: g.RUPerSec, Burst: g.Burst, Version: g.Version, Mode: g.Mode, Priority: g.Priority, Parent: g.Parent,
		Background: g.Background}
}

// Unlimited reports whether the group is never throttled.
func (s Settings) Unlimited() bool {
	return s.RUPerSec == resourcegroup.Unlimited || s.Burst == resourcegroup.BurstUnlimited || s.Mode != resourcegroup.ModeEnforce
}

// Capacity is the most the global bucket holds: 1 s of RU_PER_SEC, or 10 s
// when BURSTABLE = MODERATED. +Inf when unlimited.
func (s Settings) Capacity() float64 {
	switch {
	case s.Unlimited():
		return math.Inf(1)
	default:
		return float64(s.RUPerSec) * s.Burst.CapacitySeconds()
	}
}

// Bounds on what one request may claim. Every number a proxy sends is
// clamped to them (Request.clamp) before the allocator uses it, so no
// input, however large, makes a share, a level or a sum infinite or NaN.
const (
	// demandRateFactor bounds demand_ru_per_sec at this many times
	// RU_PER_SEC. An honest proxy's demand is the larger of its consumed
	// RU/s (at most about RU_PER_SEC + the capacity per second) and the
	// RU its waiting statements need ÷ 20 ms (tokenclient's waitLead), so
	// a proxy whose waiting statements need a whole second of the group's
	// rate reports 50 × RU_PER_SEC. Beyond that a proxy is saturated
	// whatever it says: clamping there keeps the split in proportion to
	// waiting statements up to a second of the rate (and 8 sessions each
	// waiting for a 1 RU statement on a 10 RU/s group are 40 × RU_PER_SEC),
	// while a claim of 1e308 weighs like any saturated proxy.
	demandRateFactor = 50
	// unlimitedBound bounds demand (RU/s), tokens wanted and consumption
	// (RU) for a group that is never throttled, where no rate gives a
	// scale: a trillion RU, far beyond any real proxy, still finite when
	// summed over every proxy and message.
	unlimitedBound = 1e12
	// weightHeadroom: beyond RU_PER_SEC, a slot's demand counts for the
	// split at most this many times what it asks for plus what it holds,
	// per target period, and only while that ask runs (slot.weight). An
	// honest proxy asks for 1.1 × its demand × the period minus what it
	// holds, so its demand always counts in full while it asks.
	weightHeadroom = 2.0
)

// maxDemand is the most demand_ru_per_sec counts for, in RU/s.
func (s Settings) maxDemand() float64 {
	if s.Unlimited() {
		return unlimitedBound
	}
	return demandRateFactor * float64(s.RUPerSec)
}

// maxWanted is the most one request may ask for, in RU: what a proxy at
// maxDemand asks (its demand over twice the target period) plus the
// capacity. A larger ask could not be granted anyway (a grant is at most
// the bucket's level or a trickle of the fill rate).
func (s Settings) maxWanted(period time.Duration) float64 {
	if s.Unlimited() {
		return unlimitedBound
	}
	return s.maxDemand()*2*period.Seconds() + s.Capacity()
}

// Clamped says which fields of a Request were clamped to their bound.
type Clamped uint8

const (
	// ClampedDemand: demand_ru_per_sec was over maxDemand.
	ClampedDemand Clamped = 1 << iota
	// ClampedWanted: tokens_wanted was over maxWanted.
	ClampedWanted
	// ClampedHeld: held_tokens was over the capacity or the slot's credit.
	ClampedHeld
)

// Request is one group's part of a proxy's token request.
type Request struct {
	// ProxyID keys the proxy's slot.
	ProxyID string
	// Credential names the credential the proxy authenticated with
	// (Principal.Name): the slots of one credential share one weight
	// (party). "" = none (authentication off): the slot is a party of
	// its own.
	Credential string
	// Wanted is the number of tokens asked for (RU).
	Wanted float64
	// Demand is the proxy's demand in RU/s (EWMA of consumption plus what
	// waiting statements need). 0 = derive it from Wanted / TargetPeriod.
	Demand float64
	// ReportOnly keeps the slot alive and updates its demand, granting nothing.
	ReportOnly bool
	// Held is what the proxy's local bucket holds now (RU, ≥ 0): saved
	// capacity that the global bucket must not save again.
	Held float64
}

// Grant is the allocator's answer to one Request.
type Grant struct {
	// Tokens granted (RU).
	Tokens float64
	// Trickle > 0: Tokens are to be spent evenly over this duration, and the
	// grant replaces what is left of the proxy's previous trickle for the group.
	Trickle time.Duration
	// Immediate tokens (RU) may be spent at once besides Tokens: a
	// proxy's first grant in the group tops what it holds up to its
	// share of the bucket's level, so that its first statements do not
	// wait for the trickle.
	Immediate float64
	// FillRate is the proxy's share of the fill rate, in RU/s.
	FillRate float64
	// Proxies divides the group's MAX_CONCURRENCY for this proxy (the
	// proxy takes ceil(MAX_CONCURRENCY ÷ Proxies)): the credentials
	// whose proxies have demand, times how many ids of its own
	// credential share its credential's part (see concurrencyDivisor).
	// At least 1.
	Proxies int
	// Unlimited is set for groups that are never throttled.
	Unlimited bool
	// RUPerSec and Version echo the group's settings.
	RUPerSec uint64
	Version  int64
	// Clamped: the request's fields that exceeded their bounds and were
	// clamped (for rgserver_token_request_clamped_total).
	Clamped Clamped
}

// slot is one proxy's view of a group.
type slot struct {
	id string
	// party keys the slot's credential's party in the bucket.
	party string
	// inner is the slot's weight within its party: its demand, beyond
	// RU_PER_SEC only as far as what it reports spending backs it
	// (party.reweigh).
	inner float64
	// recent is what this leader delivered to the slot lately, which
	// bounds what it may claim to hold (heldWindowSlots).
	recent deliveries
	// demand in RU/s, as last reported.
	demand float64
	// lastSeen is the time of the last request.
	lastSeen time.Time
	// rate is the RU/s of the proxy's running trickle, until trickleEnd.
	rate       float64
	trickleEnd time.Time
	// under is the group's RU/s (its service ceiling's) the running
	// trickle's share was taken from; told says the proxy was pushed
	// ask_again since (serviceLayer.setActiveCeil).
	under float64
	told  bool
	// granted is every token granted to this proxy, for metrics and tests.
	granted float64
	// held is what the proxy said its bucket held at its last request,
	// plus what it was granted at once then.
	held float64
	// claimed is the demand the proxy last sent (clamped); demand is
	// what of it counts for the split (weight).
	claimed float64
	// idleBound and askBound bound demand: idleBound always (RU_PER_SEC,
	// or weightHeadroom × what the proxy holds per target period, the
	// larger), askBound until askEnd (weightHeadroom × what it last asked
	// for plus held, per target period).
	idleBound, askBound float64
	askEnd              time.Time
	// fromPool is what the slot's held tokens drew on the bucket's
	// unbacked pool (tokens proxies may hold from an earlier leader).
	fromPool float64
	// credit is what the proxy can hold of what this leader granted it:
	// every grant, less the undelivered rest of each trickle a newer
	// grant replaced (a proxy re-asking every few milliseconds is granted
	// a whole trickle each time but gets only its rate).
	credit float64
	// ran: the proxy has reported statements it ran.
	ran bool
	// reportedAt is when the proxy last sent a message for the group,
	// rates what it reported per second (overview.go), for the console.
	reportedAt time.Time
	rates      [numRates]float64
}

// weight is the part of the slot's claimed demand that counts for the
// split: all of it up to RU_PER_SEC (or twice what the proxy holds per
// target period), beyond that only as far as its running ask backs it. A
// proxy that claims a demand it does not ask tokens for (a hostile one:
// 1e308 RU/s, report-only) so weighs at most like a proxy using the whole
// rate, and the fill it does not take goes to the proxies that ask.
func (s *slot) weight(now time.Time) float64 {
	bound := s.idleBound
	if s.askEnd.After(now) {
		bound = max(bound, s.askBound)
	}
	return min(s.claimed, bound)
}

// credible is what the slot may claim to hold at now, besides a new draw
// on the bucket's unbacked pool: what it was delivered (credit, and its
// draws on the pool), and of that only what came within heldWindowSlots
// report periods.
func (s *slot) credible(now time.Time) float64 {
	return min(s.credit+s.fromPool, s.recent.sum(now))
}

// String describes the slot at now, for logs and test failures.
func (s *slot) String(now time.Time) string {
	tr := "no trickle"
	if s.rate > 0 && s.trickleEnd.After(now) {
		tr = fmt.Sprintf("trickle %.1f RU/s for %v", s.rate, s.trickleEnd.Sub(now))
	}
	return fmt.Sprintf("proxy %s: demand %.1f RU/s (%.1f within its credential), %s, seen %v ago, granted %.1f, holds %.1f, spends %.1f RU/s",
		s.id, s.demand, s.inner, tr, now.Sub(s.lastSeen), s.granted, s.held, s.reported(now, rateRU))
}

// Bucket is one group's global token bucket and its proxies' slots. Tokens
// are what can be granted at once; running trickles reserve part of the fill
// rate, so the bucket fills at RU_PER_SEC minus the trickles' rates (and
// drains when, after a change of shares, they add up to more). Every token a
// proxy can spend therefore came out of the bucket's fill, and the total
// spendable by time T never exceeds RU_PER_SEC × T + capacity. Tokens a
// proxy saved in its own bucket count against the capacity: the bucket
// fills only to the capacity less what its proxies hold, so that a burst
// after an idle spell spends the capacity once.
type Bucket struct {
	name     string
	settings Settings
	// eff is what the bucket runs with: settings, or below the service
	// limit's ceiling for the group (servicelimit.go). Its rate and
	// capacity fill the bucket and size the trickles; the demand's bounds,
	// the weights and the persisted state follow settings.
	eff Settings
	// ceil is the service limit's ceiling on the group's RU/s (+Inf:
	// none), and svc the bucket's part in the service limit's layer.
	ceil   float64
	svc    svcEntry
	tokens float64
	last   time.Time
	slots  map[string]*slot
	// parties groups the slots by credential (party), each with the
	// weight its slots share.
	parties map[string]*party
	// reserved is the sum of the running trickles' rates.
	reserved float64
	// demand is the sum of the parties' weights, kept up to date so a
	// grant costs O(1) in the proxies of other credentials.
	demand float64
	// held is the sum of the slots' held, kept up to date the same way.
	held float64
	// nextEnd is the earliest trickleEnd among running trickles (zero if none).
	nextEnd time.Time
	// granted counts every token granted, for metrics.
	granted float64
	// usage sums the consumption proxies reported, for metrics.
	usage ru.Consumption
	// throttled sums the statements proxies reported refused with 8252,
	// for metrics.
	throttled float64
	// unbacked is how much held_tokens may claim beyond what this leader
	// delivered to the claiming slot: the tokens that were outside the bucket
	// (held by proxies, or spent) when an earlier leader saved the state
	// this one restored. 0 for a bucket this leader started full.
	unbacked float64

	// saved is the state last written to etcd (or restored from it), valid
	// when hasSaved; with none the group counts as saved full.
	saved    BucketState
	hasSaved bool
	// dirty: the bucket is on the allocator's dirty list (its level may
	// have moved away from what saved predicts).
	dirty bool
	// running counts the parties with demand (weight > 0), for
	// MAX_CONCURRENCY's divisor, unless runningStale says to count again.
	running      int
	runningStale bool
}

// A credential's proxy ids are one party in each group they use: one
// weight for the split, so that opening more ids never takes more than
// the credential's proxies would get with one (issue 29).
//
// Across parties, the weight is what one proxy would weigh: each id's
// weight (slot.weight: its claim, beyond RU_PER_SEC only while its asks
// back it) summed, but the floor every id gets without asking (RU_PER_SEC,
// or what it holds) counted once, and the whole at most maxDemand, the
// most one proxy can claim. A credential's honest proxies that ask for
// what they claim so weigh what they use together, and made-up ids add
// nothing.
//
// Within a party, its weight is split by each id's demand, beyond
// RU_PER_SEC only as far as demandRateFactor × what the id reports
// spending backs it: ids of one credential cannot be told apart by what
// they claim (they hold the same token), so an id that asks and never
// spends — one holding a leaked credential beside the real proxies — gets
// about an idle proxy's part of its credential's share, while a proxy
// that spends what it gets grows to its demand within a few reports.
type party struct {
	slots map[string]*slot
	// weight is the party's part of the bucket's demand.
	weight float64
	// inner is the sum of its slots' inner weights.
	inner float64
}

// partyOf returns s's party, made when new.
func (b *Bucket) partyOf(s *slot) *party {
	p := b.parties[s.party]
	if p == nil {
		p = &party{slots: map[string]*slot{}}
		b.parties[s.party] = p
	}
	return p
}

// reweigh recomputes p's weight and its slots' inner weights from their
// demands at now, and the bucket's demand with them. O(ids of the
// credential), which its max-streams bounds.
func (b *Bucket) reweigh(p *party, now time.Time) {
	var floors, floorCap, excess, inner float64
	for _, s := range p.slots {
		f := min(s.claimed, s.idleBound)
		floors += f
		floorCap = max(floorCap, s.idleBound)
		excess += max(s.demand-f, 0)
		s.inner = s.demand
		if len(p.slots) > 1 && !b.settings.Unlimited() {
			s.inner = min(s.demand, max(s.idleBound, demandRateFactor*s.reported(now, rateRU)))
		}
		inner += s.inner
	}
	w := min(min(floors, floorCap)+excess, b.settings.maxDemand())
	if b.settings.Unlimited() {
		w = inner
	}
	if (w > 0) != (p.weight > 0) {
		b.runningStale = true
	}
	b.demand += w - p.weight
	if b.demand < 1e-9 {
		b.demand = 0 // no float residue: a group whose proxies all went quiet has none
	}
	p.weight, p.inner = w, inner
}

// concurrencyDivisor is what s's proxy divides MAX_CONCURRENCY by: the
// parties with demand, times the ids of s's party that run statements
// (one alone in its party runs when it has demand; one beside others,
// when it has also reported statements — ever, not lately, so that
// proxies whose statements all outlast any window still count each
// other), s and its party always counted. So an id without demand takes
// no one's place, and a credential's ids share one party's place, split
// among those that run statements: an id that only claims demand beside
// the real proxies of its credential leaves them their place.
func (b *Bucket) concurrencyDivisor(s *slot) int {
	if b.runningStale {
		b.running = 0
		for _, p := range b.parties {
			if p.weight > 0 {
				b.running++
			}
		}
		b.runningStale = false
	}
	p := b.parties[s.party]
	parties := b.running
	if p == nil || p.weight <= 0 {
		parties++
	}
	ids, self := 0, false
	if p != nil {
		for _, o := range p.slots {
			if o.demand > 0 && (len(p.slots) == 1 || o.ran) {
				ids++
				self = self || o == s
			}
		}
	}
	if !self {
		ids++
	}
	return max(parties, 1) * ids
}

// heldWindowSlots: what a slot was delivered backs its held_tokens for
// that many report periods: an honest proxy gives back what it saved once idle for
// releaseAfter (20 s, tokenclient), and reports at least every
// reportPeriod. Kept as heldWindowSlots sums of one reportPeriod each, so
// a delivery stops counting between 20 and 25 s after it.
const heldWindowSlots = 5

// deliveries sums what a slot was delivered per reportPeriod, over the
// last heldWindowSlots of them.
type deliveries struct {
	epoch int64
	v     [heldWindowSlots]float64
}

func (d *deliveries) roll(now time.Time) {
	e := now.UnixNano() / int64(reportPeriod)
	switch {
	case e <= d.epoch:
		return
	case e-d.epoch >= heldWindowSlots:
		clear(d.v[:])
	default:
		for k := d.epoch + 1; k <= e; k++ {
			d.v[k%heldWindowSlots] = 0
		}
	}
	d.epoch = e
}

// add counts x delivered at now (negative: taken back).
func (d *deliveries) add(now time.Time, x float64) {
	d.roll(now)
	d.v[d.epoch%heldWindowSlots] += x
}

// sum is what was delivered within the window at now.
func (d *deliveries) sum(now time.Time) float64 {
	d.roll(now)
	t := 0.0
	for _, x := range d.v {
		t += x
	}
	return max(t, 0)
}

// String describes the bucket and its slots at now.
func (b *Bucket) String(now time.Time) string {
	var sb strings.Builder
	if b.eff.Unlimited() {
		fmt.Fprintf(&sb, "group %s: unlimited, %d proxies", b.name, len(b.slots))
	} else {
		fmt.Fprintf(&sb, "group %s: %.1f/%.0f tokens, fill %d RU/s, trickles reserve %.1f RU/s, proxies hold %.1f, %d proxies",
			b.name, b.tokens, b.eff.Capacity(), b.eff.RUPerSec, b.reserved, b.held, len(b.slots))
	}
	if !math.IsInf(b.ceil, 1) {
		fmt.Fprintf(&sb, ", service ceiling %.1f RU/s", b.ceil)
	}
	ids := make([]string, 0, len(b.slots))
	for id := range b.slots {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		sb.WriteString("\n  ")
		sb.WriteString(b.slots[id].String(now))
	}
	return sb.String()
}

// Tokens returns the bucket's level after advancing it to now.
func (b *Bucket) Tokens(now time.Time) float64 {
	b.advance(now)
	return b.tokens
}

// advance brings tokens to now, ending trickles as their periods run out.
func (b *Bucket) advance(now time.Time) {
	if b.eff.Unlimited() {
		b.last = now
		return
	}
	for !b.nextEnd.IsZero() && !b.nextEnd.After(now) {
		b.fill(b.nextEnd)
		b.endTrickles(b.nextEnd)
	}
	b.fill(now)
}

// fill adds the unreserved fill rate from b.last to t.
func (b *Bucket) fill(t time.Time) {
	dt := t.Sub(b.last).Seconds()
	if dt <= 0 {
		return
	}
	b.last = t
	rate := float64(b.eff.RUPerSec) - b.reserved
	b.tokens += rate * dt
	if c := max(b.eff.Capacity()-b.held, 0); b.tokens > c {
		b.tokens = c
	}
}

// endTrickles stops every trickle that ends at or before t, ends the
// asks that back a slot's weight until t, and recomputes reserved, the
// weights and nextEnd (the earliest trickle or ask end to come).
func (b *Bucket) endTrickles(t time.Time) {
	b.reserved = 0
	b.nextEnd = time.Time{}
	next := func(e time.Time) {
		if b.nextEnd.IsZero() || e.Before(b.nextEnd) {
			b.nextEnd = e
		}
	}
	reweigh := false
	for _, s := range b.slots {
		if !s.askEnd.IsZero() {
			if s.askEnd.After(t) {
				next(s.askEnd)
			} else {
				s.askEnd = time.Time{}
				if w := s.weight(t); w != s.demand {
					s.demand, reweigh = w, true
				}
			}
		}
		if s.rate == 0 {
			continue
		}
		if !s.trickleEnd.After(t) {
			s.rate = 0
			continue
		}
		b.reserved += s.rate
		next(s.trickleEnd)
	}
	if b.reserved < 1e-9 {
		b.reserved = 0
	}
	if reweigh {
		b.recount(t)
	}
}

// expire drops slots not seen since before now−expiry; it reports how many.
func (b *Bucket) expire(now time.Time, expiry time.Duration) int {
	b.advance(now)
	n := 0
	for id, s := range b.slots {
		if now.Sub(s.lastSeen) >= expiry {
			delete(b.slots, id)
			n++
		}
	}
	if n > 0 {
		b.endTrickles(now)
	}
	if !b.eff.Unlimited() {
		// What a silent slot claims to hold ages like a claim renewed.
		for _, s := range b.slots {
			s.held = min(s.held, s.credible(now))
		}
	}
	b.recount(now)
	return n
}

// recount sums the slots' held and the parties' weights again, the
// parties rebuilt from the slots; recomputed rather than adjusted, so
// float rounding never accumulates.
func (b *Bucket) recount(now time.Time) {
	b.demand, b.held = 0, 0
	clear(b.parties)
	for _, s := range b.slots {
		b.held += s.held
		b.partyOf(s).slots[s.id] = s
	}
	for _, p := range b.parties {
		p.weight = 0
		b.reweigh(p, now)
	}
	b.runningStale = true
}

// removeSlot drops one proxy's slot at now (a credential's proxy id that
// made room for another, proxies.go). What is left of its running trickle
// counts as spent, as in a persisted state, so that dropping a slot never
// lets the group spend more than RU_PER_SEC × T + capacity.
func (b *Bucket) removeSlot(id string, now time.Time) bool {
	s := b.slots[id]
	if s == nil {
		return false
	}
	b.advance(now)
	if s.rate > 0 && s.trickleEnd.After(now) && !b.eff.Unlimited() {
		b.tokens -= s.rate * s.trickleEnd.Sub(now).Seconds()
	}
	delete(b.slots, id)
	b.endTrickles(now)
	b.recount(now)
	return true
}

// clamp bounds req's numbers by the group's settings (see maxDemand,
// maxWanted; held is bounded in acquire, where the slot is known) and
// says which it changed. Negative and NaN values count as 0 (validation
// refuses them before; the allocator must hold on any input).
func (r *Request) clamp(st Settings, period time.Duration) Clamped {
	var c Clamped
	bound := func(v *float64, hi float64, flag Clamped) {
		switch {
		case !(*v >= 0): // negative or NaN
			*v = 0
		case *v > hi:
			*v = hi
			c |= flag
		}
	}
	bound(&r.Demand, st.maxDemand(), ClampedDemand)
	bound(&r.Wanted, st.maxWanted(period), ClampedWanted)
	if !(r.Held >= 0) {
		r.Held = 0
	}
	return c
}

// acquire serves one request at now.
func (b *Bucket) acquire(req Request, now time.Time, cfg AllocConfig) Grant {
	b.advance(now)
	s := b.slots[req.ProxyID]
	isNew := s == nil
	if isNew {
		s = &slot{id: req.ProxyID, party: req.Credential}
		if req.Credential == "" {
			s.party = "\x00" + req.ProxyID // a party of its own
		}
		b.slots[req.ProxyID] = s
		b.partyOf(s).slots[s.id] = s
		b.runningStale = true
	}
	s.lastSeen = now
	clamped := req.clamp(b.settings, cfg.TargetPeriod)
	period := cfg.TargetPeriod.Seconds()
	d := req.Demand
	if d <= 0 && !req.ReportOnly {
		d = min(req.Wanted/period, b.settings.maxDemand())
	}
	asking := !req.ReportOnly && req.Wanted > 0
	s.claimed = d
	if b.eff.Unlimited() {
		s.idleBound, s.askEnd = d, time.Time{}
	} else {
		// held_tokens is believed up to the capacity and up to what the
		// proxy can hold: what this leader delivered to it (credit), plus
		// its part of what an earlier leader's proxies held (unbacked).
		// A claim beyond that would stop the bucket saving the group's
		// burst.
		h := req.Held
		if c := b.eff.Capacity(); h > c {
			h = c
			clamped |= ClampedHeld
		}
		// And only for what was delivered within heldWindowSlots report periods: an honest
		// proxy gives back what it saved once idle for releaseAfter, so
		// an older claim is a proxy keeping the group's burst from the
		// bucket without spending it.
		if credible := s.credible(now); h > credible {
			take := min(h-credible, b.unbacked)
			b.unbacked -= take
			s.fromPool += take
			s.recent.add(now, take)
			if h > credible+take {
				h = credible + take
				clamped |= ClampedHeld
			}
		}
		b.held += h - s.held
		s.held = h
		// An unlimited group held to the service limit's ceiling
		// weighs its proxies by the ceiling; a limited one by RU_PER_SEC.
		idle := float64(b.settings.RUPerSec)
		if b.settings.Unlimited() {
			idle = float64(b.eff.RUPerSec)
		}
		s.idleBound = max(idle, weightHeadroom*h/period)
		// An ask lifts the weight for a trickle period, which ends like a
		// trickle does (endTrickles); only when it lifts it, so that
		// groups whose demands stay under RU_PER_SEC never walk their
		// slots for it.
		if asking && d > s.idleBound {
			s.askBound = weightHeadroom * (req.Wanted + h) / period
			s.askEnd = now.Add(cfg.TricklePeriod)
			if b.nextEnd.IsZero() || s.askEnd.Before(b.nextEnd) {
				b.nextEnd = s.askEnd
			}
		}
	}
	s.demand = s.weight(now)
	pt := b.partyOf(s)
	b.reweigh(pt, now)

	g := Grant{Proxies: b.concurrencyDivisor(s), RUPerSec: b.eff.RUPerSec, Version: b.settings.Version, Clamped: clamped}
	if b.eff.Unlimited() {
		g.Unlimited = true
		g.RUPerSec = 0
		if !req.ReportOnly {
			g.Tokens = req.Wanted
		}
		g.FillRate = math.Max(s.demand, req.Wanted/period)
		s.granted += g.Tokens
		b.granted += g.Tokens
		return g
	}

	rate := float64(b.eff.RUPerSec)
	total := math.Max(b.demand, 0)
	// The proxy's share of the fill rate is its credential's share, in
	// proportion to the credential's weight, whether total demand is
	// above RU_PER_SEC or below it (then the spare is split the same
	// way), times its part of that weight; with no demand at all, shares
	// are equal.
	var frac float64
	if total > 0 {
		if pt.inner > 0 {
			frac = math.Min(pt.weight/total*(s.inner/pt.inner), 1)
		}
	} else {
		frac = 1 / float64(len(b.slots))
	}
	g.FillRate = rate * frac
	if req.ReportOnly || req.Wanted <= 0 {
		return g
	}
	s.told = false // it asked

	// A new grant replaces what is left of this proxy's running trickle, so
	// its reservation ends now.
	// (nextEnd may now be early; advance then just recomputes.)
	if s.rate > 0 {
		if s.trickleEnd.After(now) {
			rest := s.rate * s.trickleEnd.Sub(now).Seconds()
			s.credit -= rest
			s.recent.add(now, -rest)
		}
		b.reserved -= s.rate
		s.rate = 0
		if b.reserved < 1e-9 {
			b.reserved = 0
		}
	}
	if total <= rate && b.tokens >= req.Wanted {
		g.Tokens = req.Wanted
		b.tokens -= req.Wanted
		s.held += g.Tokens // the proxy holds them now
		b.held += g.Tokens
	} else {
		// A proxy's first grant in the group: its share of what the bucket
		// holds at once, less what it holds already, rather than spread
		// over the trickle (the first statements of a freshly used group
		// waited ~19 ms for it with tokens to spare). Out of the bucket,
		// as an at-once grant: the bound below holds.
		if s.granted == 0 && b.tokens > 0 {
			if imm := math.Min(b.tokens*frac, req.Wanted) - s.held; imm > 0 {
				g.Immediate = imm
				b.tokens -= imm
				s.held += imm // the proxy holds them now
				b.held += imm
			}
		}
		// Short, or oversubscribed: a trickle of the proxy's share of the
		// fill rate, plus its share of what the bucket holds (or minus its
		// share of the bucket's debt), spread over the target period.
		r := g.FillRate + b.tokens*frac/period
		r = math.Min(r, (req.Wanted-g.Immediate)/period)
		// Never reserve more of the fill than other proxies' running
		// trickles leave free: after a change of shares a proxy whose share
		// grew waits for theirs to end (one period at most) rather than the
		// group overdrawing its bucket, which would let more than
		// RU_PER_SEC × T + capacity be spent by time T.
		r = math.Min(r, rate-b.reserved+math.Max(b.tokens, 0)/period)
		// A proxy's first trickle is short: when many proxies (re)connect
		// at once, as after a leader change, the first to ask would
		// otherwise hold a share computed before the others were known.
		dur := cfg.TricklePeriod
		if isNew {
			dur = min(dur, firstTrickle)
		}
		if r > 0 {
			s.rate, s.under = r, rate
			s.trickleEnd = now.Add(dur)
			b.reserved += r
			if b.nextEnd.IsZero() || s.trickleEnd.Before(b.nextEnd) {
				b.nextEnd = s.trickleEnd
			}
			g.Tokens = r * dur.Seconds()
			g.Trickle = dur
		}
	}
	s.granted += g.Tokens + g.Immediate
	s.credit += g.Tokens + g.Immediate
	s.recent.add(now, g.Tokens+g.Immediate)
	b.granted += g.Tokens + g.Immediate
	return g
}

// Allocator holds one Bucket per group. It is pure logic: every method takes
// the time, and it is not safe for concurrent use (the server serializes it).
//
// It keeps a list of the buckets whose level may have left what their
// saved state predicts (TakeDirty), so that persisting costs work in
// proportion to the groups in use, not to every group held.
type Allocator struct {
	cfg    AllocConfig
	groups map[string]*Bucket
	dirty  []*Bucket
	// gen counts the groups added and removed, so that a list of the
	// groups kept outside (the scrape's names in order) knows it is
	// stale. An allocator that replaces another starts above its gen
	// (Succeed).
	gen uint64
	// svc is the service limit's layer above the groups (servicelimit.go).
	svc serviceLayer
}

// NewAllocator returns an empty allocator.
func NewAllocator(cfg AllocConfig) *Allocator {
	a := &Allocator{cfg: cfg.withDefaults(), groups: map[string]*Bucket{}}
	a.svc.groups = a.groups
	return a
}

// Config returns the allocator's configuration with defaults applied.
func (a *Allocator) Config() AllocConfig { return a.cfg }

// SetGroup adds a group with a full bucket, or updates an existing group's
// settings (its level is clipped to the new capacity).
func (a *Allocator) SetGroup(name string, s Settings, now time.Time) {
	b := a.groups[name]
	if b == nil {
		b = &Bucket{name: name, settings: s, last: now, slots: map[string]*slot{}, parties: map[string]*party{}}
		b.ceil = a.svc.idleCeil(s)
		b.eff = effectiveUnder(s, b.ceil)
		if !b.eff.Unlimited() && !s.Unlimited() {
			b.tokens = s.Capacity()
		}
		a.svc.fillSum += promisedRate(s)
		if s.Parent != "" {
			a.svc.nested++
		}
		a.groups[name] = b
		a.gen++
		return
	}
	if b.settings != s {
		a.markDirty(b) // what the saved state predicts depends on the settings
	}
	a.svc.fillSum += promisedRate(s) - promisedRate(b.settings)
	a.svc.nested += nestedDelta(b.settings, s)
	b.settings = s
	if !b.svc.active {
		b.ceil = a.svc.idleCeil(s)
	}
	// An active group keeps its ceiling until the next rebalance, which
	// the change hastens.
	a.svc.stale = true
	b.setEff(effectiveUnder(s, b.ceil), now)
}

// setEff makes eff what b runs with from now: its level is clipped to the
// new capacity; a group that was never throttled starts full, or empty
// when only the service limit's ceiling throttles it (it saved nothing).
func (b *Bucket) setEff(eff Settings, now time.Time) {
	b.advance(now)
	was := b.eff
	b.eff = eff
	switch {
	case eff.Unlimited():
		b.tokens = 0
	case was.Unlimited() && b.settings.Unlimited():
		b.tokens = 0
	case was.Unlimited():
		b.tokens = eff.Capacity()
	case b.tokens > eff.Capacity():
		b.tokens = eff.Capacity()
	}
}

// RemoveGroup forgets a dropped group (a dirty list entry is skipped
// later: it is no longer the group's bucket).
func (a *Allocator) RemoveGroup(name string) {
	if b, ok := a.groups[name]; ok {
		a.svc.fillSum -= promisedRate(b.settings)
		a.svc.nested += nestedDelta(b.settings, Settings{})
		a.svc.remove(b)
		delete(a.groups, name)
		a.gen++
	}
}

// Gen changes whenever a group is added or removed, and from an
// allocator to the one that succeeds it.
func (a *Allocator) Gen() uint64 { return a.gen }

// Succeed makes a, a new allocator, the successor of old: its generation
// starts above old's, so that nothing kept from old passes for a's.
func (a *Allocator) Succeed(old *Allocator) { a.gen = max(a.gen, old.gen) + 1 }

// Len is the number of groups held.
func (a *Allocator) Len() int { return len(a.groups) }

// Group returns a group's bucket, or nil.
func (a *Allocator) Group(name string) *Bucket { return a.groups[name] }

// Acquire serves one group's request from one proxy.
func (a *Allocator) Acquire(group string, req Request, now time.Time) (Grant, error) {
	b := a.groups[group]
	if b == nil {
		return Grant{}, fmt.Errorf("%w: %q", ErrUnknownGroup, group)
	}
	if !req.ReportOnly && req.Wanted > 0 && !b.settings.Unlimited() {
		a.markDirty(b)
	}
	if !a.svc.on() && (b.svc.active || !math.IsInf(b.ceil, 1)) {
		// The layer went off (the limit lifted, the last parent
		// detached) since b's last request: b runs as its settings say.
		a.svc.remove(b)
		b.setCeil(math.Inf(1), now)
	}
	g := b.acquire(req, now, a.cfg)
	b.svc.seen = now
	if a.svc.on() && a.svc.track(b, now) {
		// A group the service limit had not shared yet: rebalanced now
		// (at most every minRebalance), its request is served again with
		// its ceiling rather than left to ask again.
		if !req.ReportOnly && req.Wanted > 0 && g.Tokens == 0 && g.Immediate == 0 && b.ceil > 0 {
			g = b.acquire(req, now, a.cfg)
		}
	}
	return g, nil
}

// Report adds the consumption a proxy reported in a message at now, and
// the statements it refused (throttled), to a group's usage, and to the
// recent rates of the proxy's slot (slotID; none before its first
// Acquire), with the statements it refused otherwise (refused) and the
// RU of those that waited for tokens (waitedRU); false when the group is
// not held.
func (a *Allocator) Report(group, slotID string, u ru.Consumption, throttled, refused, waitedRU float64, now time.Time) bool {
	b := a.groups[group]
	if b == nil {
		return false
	}
	b.usage.Add(u)
	b.throttled += throttled
	if s := b.slots[slotID]; s != nil {
		s.report(now, [numRates]float64{u.RU(), u.Statements, throttled, refused, waitedRU})
		if u.Statements > 0 {
			s.ran = true
		}
		if p := b.parties[s.party]; p != nil && len(p.slots) > 1 {
			b.reweigh(p, now) // what it spends weighs within its credential
		}
	}
	return true
}

// lastReport is when proxy slotID last sent a message for group (zero if
// never): the interval a report covers when it does not say.
func (a *Allocator) lastReport(group, slotID string) time.Time {
	if b := a.groups[group]; b != nil {
		if s := b.slots[slotID]; s != nil {
			return s.reportedAt
		}
	}
	return time.Time{}
}

// markDirty puts b on the dirty list once. Only the leader takes the
// list (TakeDirty); on a follower, whose buckets change with every ALTER,
// the list would keep every bucket since dropped, so it is cut back to
// the buckets still held once it outgrows them.
func (a *Allocator) markDirty(b *Bucket) {
	if !b.dirty {
		b.dirty = true
		a.dirty = append(a.dirty, b)
		if len(a.dirty) > 2*len(a.groups)+64 {
			a.dirty = slices.DeleteFunc(a.dirty, func(d *Bucket) bool { return !a.Held(d) })
		}
	}
}

// TakeDirty hands over the dirty list and starts a new one. The buckets
// stay marked until ToSave looks at them, so a bucket changed meanwhile is
// not listed twice; one that ToSave has looked at is listed again by its
// next change. A bucket on the list may have been dropped since: see Held.
func (a *Allocator) TakeDirty() []*Bucket {
	d := a.dirty
	a.dirty = nil
	return d
}

// Held reports whether b is the bucket the allocator holds for its group.
func (a *Allocator) Held(b *Bucket) bool { return a.groups[b.name] == b }

// Name returns the bucket's group.
func (b *Bucket) Name() string { return b.name }

// Expire drops the slots of proxies not heard from for ClientExpiry; it
// reports how many were dropped.
func (a *Allocator) Expire(now time.Time) int {
	n := 0
	for _, b := range a.groups {
		n += b.expire(now, a.cfg.ClientExpiry)
	}
	return n
}

// Proxies returns the number of live slots of a group (0 if unknown).
func (a *Allocator) Proxies(group string) int {
	if b := a.groups[group]; b != nil {
		return len(b.slots)
	}
	return 0
}

// BucketState is the part of a bucket persisted across leaders.
type BucketState struct {
	// Tokens is the bucket's level at At.
	Tokens float64 `json:"tokens"`
	// At is when Tokens was measured.
	At time.Time `json:"at"`
}

// State returns a group's persistable state at now.
func (a *Allocator) State(group string, now time.Time) (BucketState, bool) {
	b := a.groups[group]
	if b == nil || b.settings.Unlimited() {
		return BucketState{}, false
	}
	return b.state(now), true
}

func (b *Bucket) state(now time.Time) BucketState {
	b.advance(now)
	// Running trickles are promises already made: count them as spent, so a
	// new leader does not hand the same tokens out again.
	t := b.tokens
	for _, s := range b.slots {
		if s.rate > 0 && s.trickleEnd.After(now) {
			t -= s.rate * s.trickleEnd.Sub(now).Seconds()
		}
	}
	return BucketState{Tokens: t, At: now}
}

// refilled is the level a persisted state predicts at now: what Restore
// would set.
func (s Settings) refilled(st BucketState, now time.Time) float64 {
	t := st.Tokens
	if el := now.Sub(st.At).Seconds(); el > 0 {
		t += float64(s.RUPerSec) * el
	}
	return math.Min(t, s.Capacity())
}

// Restore sets a known group's level from a persisted state, refilled for the
// time since it was taken; the state counts as saved.
func (a *Allocator) Restore(group string, st BucketState, now time.Time) {
	b := a.groups[group]
	if b == nil || b.settings.Unlimited() {
		return
	}
	b.tokens = b.settings.refilled(st, now)
	b.last = now
	b.saved, b.hasSaved = st, true
	// What was not in the bucket when st was taken was spent or is held
	// by proxies: their held_tokens may claim that much without a grant
	// from this leader.
	b.unbacked = math.Max(b.settings.Capacity()-math.Max(st.Tokens, 0), 0)
}

// Saving thresholds: a state is written when the level differs from what
// the saved one predicts by more than saveFraction of the capacity (and at
// least saveMinRU); at a hand-over, by more than handoverRU.
const (
	saveFraction = 0.01
	saveMinRU    = 1.0
	handoverRU   = 0.01
)

// ToSave clears b's dirty mark and returns its state at now when it
// differs meaningfully from what its saved state predicts (the saved
// state refilled at RU_PER_SEC up to the capacity, as Restore does): an
// idle bucket follows the prediction exactly and is never written again.
// handover lowers the threshold to nearly any difference.
func (b *Bucket) ToSave(now time.Time, handover bool) (BucketState, bool) {
	b.dirty = false
	if b.settings.Unlimited() {
		return BucketState{}, false
	}
	st := b.state(now)
	want := b.settings.Capacity() // never saved: a new leader starts it full
	if b.hasSaved {
		want = b.settings.refilled(b.saved, now)
	}
	eps := math.Max(saveFraction*b.settings.Capacity(), saveMinRU)
	if handover {
		eps = handoverRU
	}
	return st, math.Abs(st.Tokens-want) > eps
}

// Saved records that st was written to etcd for b.
func (b *Bucket) Saved(st BucketState) { b.saved, b.hasSaved = st, true }

// Redirty puts back on the dirty list a bucket whose state could not be
// written, if it is still held.
func (a *Allocator) Redirty(b *Bucket) {
	if a.Held(b) {
		a.markDirty(b)
	}
}
