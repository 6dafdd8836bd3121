package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Proxy capabilities (docs/design.md §7.8). Each AcquireTokens stream
// says, in its first message, what its proxy can enforce; the leader
// refuses a QUERY_LIMIT ... ACTION = KILL that some live proxy could not
// carry out, so that a KILL rule never silently does not kill.

// Bounds of the capabilities registry and of its strings from the network.
const (
	// maxCapEntries bounds the streams whose capabilities are kept;
	// streams beyond it count as proxies that cannot kill, unnamed.
	maxCapEntries = 10000
	// maxVersionLen bounds the version a proxy sends (its instance is
	// bounded by maxInstanceLen, as in an Inspect hello).
	maxVersionLen = 64
	// maxNamedProxies is how many incapable proxies a refusal names.
	maxNamedProxies = 5
	// maxNameInMessage bounds one name quoted in a refusal.
	maxNameInMessage = 100
)

// DefaultCapabilityWindow is how long a new leader waits, from the start
// of its term, before it judges a KILL rule: the proxies reconnect to it
// within a second or two of the election (backoff at most 2 s), and until
// then it does not know them all.
const DefaultCapabilityWindow = 3 * time.Second

// errNotLeaderForCaps: only the leader knows the live proxies.
var errNotLeaderForCaps = errors.New("tokenserver: not the leader")

// proxyCaps is what one token stream said about its proxy.
type proxyCaps struct {
	slot     string // credential-qualified proxy id (slotID)
	proxyID  string
	instance string
	version  string
	canKill  bool
	declared bool // the stream sent ProxyCapabilities at all
}

// capsRegistry holds the capabilities of the proxies with a live token
// stream on this replica, one entry per stream.
type capsRegistry struct {
	mu      sync.Mutex
	next    uint64
	entries map[uint64]proxyCaps
	// untracked counts live streams beyond maxCapEntries.
	untracked int
}

func newCapsRegistry() *capsRegistry { return &capsRegistry{entries: map[uint64]proxyCaps{}} }

// add registers a stream's proxy; update replaces what it said (a later
// message with capabilities), remove drops it when the stream ends.
func (r *capsRegistry) add(c proxyCaps) (update func(proxyCaps), remove func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) >= maxCapEntries {
		r.untracked++
		return func(proxyCaps) {}, func() {
			r.mu.Lock()
			r.untracked--
			r.mu.Unlock()
		}
	}
	r.next++
	id := r.next
	r.entries[id] = c
	return func(c proxyCaps) {
			r.mu.Lock()
			if _, ok := r.entries[id]; ok {
				r.entries[id] = c
			}
			r.mu.Unlock()
		}, func() {
			r.mu.Lock()
			delete(r.entries, id)
			r.mu.Unlock()
		}
}

// withoutKill returns the live proxies that cannot kill, one per proxy
// (a reconnecting proxy may have two streams for a moment), sorted by
// instance, and how many streams beyond the registry's bound there are.
func (r *capsRegistry) withoutKill() (out []proxyCaps, untracked int, live int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	canKill := map[string]bool{}
	for _, c := range r.entries {
		seen[c.slot] = true
		if c.canKill {
			canKill[c.slot] = true
		}
	}
	bad := map[string]proxyCaps{}
	for _, c := range r.entries {
		// A stream of the same proxy that says it can kill wins: the
		// newer process (a restart with --admin-user) takes the id over.
		if !c.canKill && !canKill[c.slot] {
			bad[c.slot] = c
		}
	}
	for _, c := range bad {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].instance != out[j].instance {
			return out[i].instance < out[j].instance
		}
		return out[i].slot < out[j].slot
	})
	return out, r.untracked, len(seen) + r.untracked
}

// countWithoutKill is rgserver_proxies_without_kill.
func (r *capsRegistry) countWithoutKill() float64 {
	out, untracked, _ := r.withoutKill()
	return float64(len(out) + untracked)
}

// capsFromPB validates a stream's ProxyCapabilities: strings are capped
// and stripped of what is not printable, since they end up in logs and in
// a client's error message.
func capsFromPB(p Principal, proxyID string, c *pb.ProxyCapabilities) proxyCaps {
	out := proxyCaps{slot: slotID(p, proxyID), proxyID: printable(proxyID, maxProxyIDLen)}
	if c == nil {
		return out
	}
	out.declared = true
	out.canKill = c.GetCanKill()
	out.instance = printable(c.GetInstance(), maxInstanceLen)
	out.version = printable(c.GetVersion(), maxVersionLen)
	return out
}

// printable keeps the printable runes of s, at most max bytes of them.
func printable(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		if !unicode.IsPrint(r) {
			continue
		}
		if b.Len()+len(string(r)) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// clip shortens s for a message.
func clip(s string) string {
	if len(s) <= maxNameInMessage {
		return s
	}
	return printable(s, maxNameInMessage-3) + "..."
}

// hasKillRule reports whether g's QUERY_LIMIT kills.
func hasKillRule(g resourcegroup.Group) bool {
	return g.QueryLimit != nil && g.QueryLimit.Action == resourcegroup.ActionKill
}

// checkKillRule refuses g, about to be written, when it brings a
// QUERY_LIMIT ... ACTION = KILL that some live proxy cannot carry out.
// old is the group's definition before (nil for a new group): a KILL rule
// it already had, unchanged, is not judged again, so that an unrelated
// ALTER still works. Only the leader knows the live proxies: a follower
// answers Unavailable (the proxy then asks the next replica), and a leader
// in the first capability window of its term waits for the window's end.
func (s *Server) checkKillRule(ctx context.Context, g resourcegroup.Group, old *resourcegroup.Group) error {
	if !hasKillRule(g) {
		return nil
	}
	if old != nil && hasKillRule(*old) && *old.QueryLimit == *g.QueryLimit {
		return nil
	}
	if err := s.waitCapabilityWindow(ctx); err != nil {
		return err
	}
	bad, untracked, live := s.caps.withoutKill()
	if len(bad) == 0 && untracked == 0 {
		return nil
	}
	n := len(bad) + untracked
	var names []string
	for _, c := range bad[:min(len(bad), maxNamedProxies)] {
		inst := c.instance
		if inst == "" {
			inst = "instance unknown"
		}
		why := ""
		if !c.declared {
			why = ", did not say what it can enforce (an older rgproxy?)"
		}
		names = append(names, fmt.Sprintf("%s (proxy id %s%s)", clip(inst), clip(c.proxyID), why))
	}
	if rest := n - len(names); rest > 0 {
		names = append(names, fmt.Sprintf("%d more", rest))
	}
	s.log.Warn("refused a QUERY_LIMIT ACTION=KILL that live proxies cannot carry out",
		"group", g.Name, "proxies_without_kill", n, "live_proxies", live, "named", names)
	return status.Errorf(codes.FailedPrecondition,
		"QUERY_LIMIT ACTION=KILL of resource group '%s' cannot be enforced by %d of %d live rgproxy instances: %s. "+
			"Restart them with --admin-user and --admin-password-file (the service account that runs KILL QUERY), "+
			"or stop them, or choose ACTION=COOLDOWN or DRYRUN",
		g.Name, n, live, strings.Join(names, ", "))
}

// waitCapabilityWindow returns once this replica may judge the live
// proxies: it is the leader and its term is older than the capability
// window (waiting, within ctx, for the rest of the window).
func (s *Server) waitCapabilityWindow(ctx context.Context) error {
	for {
		if !s.IsLeader() {
			return status.Errorf(codes.Unavailable,
				"%v: only the leader knows which proxies can enforce QUERY_LIMIT ACTION=KILL (leader: %q)", errNotLeaderForCaps, s.LeaderAddr())
		}
		since := s.leaderSince.Load()
		if since == nil {
			return status.Error(codes.Unavailable, "rgserver is taking leadership; try again")
		}
		left := s.cfg.CapabilityWindow - s.now().Sub(*since)
		if left <= 0 {
			return nil
		}
		t := time.NewTimer(min(left, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
}
