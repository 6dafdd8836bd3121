package mysqlproto

import (
	"net"
	"net/netip"
	"sync"
)

// RefusalReason says why a connection was answered ERR 1040 at once
// (Stats.Refused, rgproxy_connections_refused_total{reason}).
type RefusalReason int

// The reasons a connection is refused.
const (
	// RefusedMaxConnections: Config.MaxConnections sessions are open.
	RefusedMaxConnections RefusalReason = iota
	// RefusedUnauthenticated: Config.MaxUnauthenticated connections have
	// not logged in yet.
	RefusedUnauthenticated
	// RefusedUnauthenticatedPerHost: Config.MaxUnauthenticatedPerHost
	// connections from the client's address (its /64 for IPv6) have not
	// logged in yet.
	RefusedUnauthenticatedPerHost
	// RefusedDescriptors: the process ran out of file descriptors.
	RefusedDescriptors
	// NumRefusalReasons is the number of reasons.
	NumRefusalReasons
)

var refusalNames = [NumRefusalReasons]string{"max_connections", "unauthenticated", "unauthenticated_per_host", "file_descriptors"}

// String is the reason's metric label.
func (r RefusalReason) String() string {
	if r < 0 || r >= NumRefusalReasons {
		return "unknown"
	}
	return refusalNames[r]
}

// DefaultMaxConnections derives a ceiling of client sessions from the
// limit of open file descriptors, nofile: each session holds up to three
// (its client's and its backend's sockets, and the backend thread's
// schedstat file when CPU time is read from /proc), and a reserve of
// 64 + nofile/16 is left for the listeners, the status port and its
// /readyz probes, rgserver, the service connection, the epoll sets and
// the refusals themselves.
func DefaultMaxConnections(nofile uint64) int {
	reserve := 64 + nofile/16
	if nofile <= reserve+3 {
		return 1
	}
	return int(min((nofile-reserve)/3, 1<<30))
}

// preAuthGate counts the connections that have not logged in, in all and
// per source (an IPv4 address, an IPv6 /64): each holds a backend
// connection that has not authenticated, which the backend counts against
// its max_connections.
type preAuthGate struct {
	mu     sync.Mutex
	total  int
	byHost map[netip.Prefix]int
}

// hostKey is the per-host bucket of a remote address: the IPv4 address,
// or the /64 of an IPv6 one (a host is given a /64 or more). An address
// that is not IP shares one bucket.
func hostKey(a net.Addr) netip.Prefix {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Prefix{}
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// enter admits a connection from host unless total or perHost (<= 0:
// unbounded) connections are already waiting to log in; ok false says
// which bound refused it.
func (g *preAuthGate) enter(host netip.Prefix, total, perHost int) (RefusalReason, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if total > 0 && g.total >= total {
		return RefusedUnauthenticated, false
	}
	if perHost > 0 && g.byHost[host] >= perHost {
		return RefusedUnauthenticatedPerHost, false
	}
	g.total++
	g.byHost[host]++
	return 0, true
}

// leave releases what enter admitted.
func (g *preAuthGate) leave(host netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if n := g.byHost[host] - 1; n > 0 {
		g.byHost[host] = n
	} else {
		delete(g.byHost, host)
	}
}

// count is the number of connections waiting to log in.
func (g *preAuthGate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.total
}
