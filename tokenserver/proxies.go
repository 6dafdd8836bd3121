package tokenserver

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A proxy id is bound to the credential that uses it. Its slots are keyed
// by the credential's name and the id (slotID), so one credential cannot
// touch another's slots, and a credential configured for N streams holds
// at most N proxy ids with slots at once: a new id beyond N takes the
// place of one whose stream has ended (its slots are dropped at once,
// rather than when they expire), and is refused while all N have live
// streams. Cycling ids therefore never piles up slots, and fake ids cannot
// inflate a group's proxy count (MAX_CONCURRENCY's split, degraded-mode
// refill) beyond what the credential is configured for. A stream that
// comes back with its id (a reconnect) takes the id over; the stream it
// replaces is ended at its next message.

// errStreamLimit: the credential holds as many streams or proxy ids as
// it is configured for.
var errStreamLimit = errors.New("tokenserver: credential at its stream limit")

// streamKinds are the long-lived streams counted per credential.
const (
	kindTokens = iota
	kindSettings
	kindInspect
	numKinds
)

// streamTicket is one AcquireTokens stream's hold on its proxy id.
type streamTicket struct {
	// superseded: a newer stream took the id over.
	superseded atomic.Bool
}

// idHold is one proxy id of a credential.
type idHold struct {
	// live is the stream holding the id; nil once it ended.
	live *streamTicket
	// ended is when the last stream holding it ended.
	ended time.Time
}

// credHolds is what one credential holds.
type credHolds struct {
	open [numKinds]int
	ids  map[string]*idHold
}

// proxyRegistry tracks, per credential with a stream limit, its open
// streams and its proxy ids.
type proxyRegistry struct {
	// expiry: a proxy id whose stream ended this long ago has no slots
	// left (the allocator expired them), so it no longer counts.
	expiry time.Duration

	mu    sync.Mutex
	creds map[string]*credHolds
}

func newProxyRegistry(expiry time.Duration) *proxyRegistry {
	return &proxyRegistry{expiry: expiry, creds: map[string]*credHolds{}}
}

// slotID is the allocator's key for a proxy id sent under p: the id alone
// when authentication is off, else qualified by the credential.
func slotID(p Principal, proxyID string) string {
	if p.Name == "" {
		return proxyID
	}
	return p.Name + "/" + proxyID
}

func (r *proxyRegistry) holds(name string) *credHolds {
	h := r.creds[name]
	if h == nil {
		h = &credHolds{ids: map[string]*idHold{}}
		r.creds[name] = h
	}
	return h
}

// forget drops a credential's entry once it holds nothing.
func (r *proxyRegistry) forget(name string, h *credHolds) {
	if len(h.ids) == 0 && h.open == [numKinds]int{} && r.creds[name] == h {
		delete(r.creds, name)
	}
}

// open counts a new stream of kind for p: at most MaxStreams + 1 at once
// (one more for a reconnect that overlaps the stream it replaces). close
// ends it.
func (r *proxyRegistry) open(p Principal, kind int) (closeFn func(), err error) {
	if p.MaxStreams == 0 {
		return func() {}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.holds(p.Name)
	if h.open[kind] >= p.MaxStreams+1 {
		r.forget(p.Name, h)
		return nil, fmt.Errorf("%w: %q has %d streams of this kind open, it is configured for %d", errStreamLimit, p.Name, h.open[kind], p.MaxStreams)
	}
	h.open[kind]++
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		h.open[kind]--
		r.forget(p.Name, h)
	}, nil
}

// bind gives proxyID to a new AcquireTokens stream of p at now. evict
// lists the slot ids whose slots the caller must drop (an id whose
// stream ended, making room). release ends the hold.
func (r *proxyRegistry) bind(p Principal, proxyID string, now time.Time) (t *streamTicket, evict []string, release func(time.Time), err error) {
	t = &streamTicket{}
	if p.MaxStreams == 0 {
		return t, nil, func(time.Time) {}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.holds(p.Name)
	release = func(at time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if e := h.ids[proxyID]; e != nil && e.live == t {
			e.live, e.ended = nil, at
		}
	}
	if e := h.ids[proxyID]; e != nil {
		if e.live != nil {
			e.live.superseded.Store(true)
		}
		e.live = t
		return t, nil, release, nil
	}
	var oldest string
	for id, e := range h.ids {
		if e.live != nil {
			continue
		}
		if now.Sub(e.ended) >= r.expiry {
			delete(h.ids, id) // its slots have expired
			continue
		}
		if oldest == "" || e.ended.Before(h.ids[oldest].ended) {
			oldest = id
		}
	}
	if len(h.ids) >= p.MaxStreams {
		if oldest == "" {
			return nil, nil, nil, fmt.Errorf("%w: %q already has %d proxies streaming, it is configured for %d", errStreamLimit, p.Name, len(h.ids), p.MaxStreams)
		}
		delete(h.ids, oldest)
		evict = append(evict, slotID(p, oldest))
	}
	h.ids[proxyID] = &idHold{live: t}
	return t, evict, release, nil
}

// streams reports whether proxyID has a live AcquireTokens stream under
// p, or p is not bounded (administrators, authentication off): an
// Inspect stream may only speak for such a proxy id, so a credential
// shows no more instances in a cluster view than it streams tokens for.
func (r *proxyRegistry) streams(p Principal, proxyID string) bool {
	if p.MaxStreams == 0 {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.creds[p.Name]
	if h == nil {
		return false
	}
	e := h.ids[proxyID]
	return e != nil && e.live != nil
}
