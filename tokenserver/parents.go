package tokenserver

import (
	"math"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Groups inside groups (PARENT = g): a parent's RU_PER_SEC holds over
// the sum of its children, shared the way the service limit shares the
// backend's capacity (servicelimit.go), as ceilings on the RU/s of the
// groups with demand, recomputed at the same rebalances. At each parent,
// top down, the members are its children's subtrees and, when the parent
// has statements of its own (sessions bound to it), the parent itself:
//
//  1. each child's subtree gets its demand up to the child's own
//     RU_PER_SEC first (in proportion to those when together they exceed
//     the parent's rate);
//  2. then the demand beyond RU_PER_SEC of the children that may burst
//     (BURSTABLE = UNLIMITED or RU_PER_SEC = UNLIMITED) and the parent's
//     own demand, in proportion, from what is left;
//  3. what nobody asks for is spread in proportion to demand, so that a
//     member whose demand grows finds room until the next rebalance.
//
// A child that is itself a parent shares what its subtree got, capped by
// its own RU_PER_SEC, among its own members the same way. A group's
// ceiling is the least of its part of its parent's pool and the service
// limit's ceiling. A parent that is never throttled (RU_PER_SEC or
// BURSTABLE UNLIMITED, MODE WARN or OFF) limits nothing: its children
// keep their own rates. The proxies need nothing new: a group's grants
// and trickles follow its ceiling as under the service limit, whatever
// its depth, so no level costs a round trip.
//
// The cost is O(groups with demand × depth) per rebalance; the walk up
// a group's parents stops after maxAncestors (deeper chains and cycles,
// which the SQL refuses, are cut there).

// maxAncestors bounds the parents a group's walk up the tree visits: a
// group, its parent and its parent's parent (resourcegroup.MaxDepth
// levels).
const maxAncestors = resourcegroup.MaxDepth - 1

// poolNode is a group in the tree of the groups with demand and their
// parents, built at each rebalance.
type poolNode struct {
	b *Bucket
	// own: the group has demand of its own (it is in the layer's active
	// list); sub is its subtree's demand, own included (RU/s).
	own      bool
	sub      float64
	children []*poolNode
	// parented: linked under its parent.
	parented bool
}

// treeScratch is parentCeilings' memory, reused at every rebalance.
type treeScratch struct {
	nodes map[*Bucket]*poolNode
	slab  []poolNode
	ceil  map[*Bucket]float64
}

// parentCeilings returns each group with demand under a parent, with its
// part of its parents' pools (RU/s), from the demands of the last
// rebalance (svc.demand); nil while no group has a parent. The map is
// valid until the next call. The service limit counts a group's demand
// only up to it, so that what a parent holds back of its children is
// shared among the limit's other groups, and each group's ceiling is the
// least of the two.
func (l *serviceLayer) parentCeilings() map[*Bucket]float64 {
	if l.nested == 0 {
		return nil
	}
	// The tree is built in scratch kept between rebalances (treeScratch):
	// at 100,000 groups with demand, fresh maps and nodes every 250 ms
	// were most of a rebalance's cost and ~100 MiB of resident memory.
	sc := &l.tree
	if sc.nodes == nil {
		sc.nodes, sc.ceil = map[*Bucket]*poolNode{}, map[*Bucket]float64{}
	}
	clear(sc.nodes)
	clear(sc.ceil)
	// Every node is an active group or one of its ancestors: with room
	// for all of them, appends never move the slab under the pointers
	// the map and the children hold.
	if need := len(l.active) * (1 + maxAncestors); cap(sc.slab) < need {
		sc.slab = make([]poolNode, 0, need)
	}
	sc.slab = sc.slab[:0]
	nodes := sc.nodes
	node := func(b *Bucket) *poolNode {
		n := nodes[b]
		if n == nil {
			sc.slab = sc.slab[:len(sc.slab)+1]
			n = &sc.slab[len(sc.slab)-1]
			*n = poolNode{b: b, children: n.children[:0]} // keep the old node's array
			nodes[b] = n
		}
		return n
	}
	for _, b := range l.active {
		n := node(b)
		n.own = true
		d := b.svc.demand
		n.sub += d
		for range maxAncestors {
			p := l.groups[n.b.settings.Parent]
			if p == nil || p == n.b {
				break
			}
			pn := node(p)
			if !n.parented {
				n.parented = true
				pn.children = append(pn.children, n)
			}
			pn.sub += d
			n = pn
		}
	}
	ceil := sc.ceil
	for _, n := range nodes {
		if !n.parented && len(n.children) > 0 {
			sharePool(n, poolOf(n.b.settings, math.Inf(1)), ceil)
		}
	}
	return ceil
}

// poolOf is what a parent with settings s shares among its members when
// its own parent gave it got RU/s (+Inf: no limit above it).
func poolOf(s Settings, got float64) float64 {
	if s.Unlimited() {
		return got
	}
	return min(got, float64(s.RUPerSec))
}

// sharePool shares pool RU/s (+Inf: no limit) among n's members and
// records in ceil each member group's part of it, recursing into the
// children that are parents.
func sharePool(n *poolNode, pool float64, ceil map[*Bucket]float64) {
	// Each child's subtree asks for its demand up to the child's own
	// rate (fill), and beyond it if the child may burst; the parent's
	// own statements ask only beyond (the pool is the parent's rate).
	var fills, bursts, demand float64
	fill := make([]float64, len(n.children))
	for i, c := range n.children {
		s := c.b.settings
		if s.Mode == resourcegroup.ModeEnforce && s.RUPerSec != resourcegroup.Unlimited {
			fill[i] = min(c.sub, float64(s.RUPerSec))
		}
		fills += fill[i]
		if mayBurst(s) || s.Mode != resourcegroup.ModeEnforce {
			bursts += c.sub - fill[i]
		}
		demand += c.sub
	}
	ownDemand := 0.0
	if n.own {
		ownDemand = n.b.svc.demand
		bursts += ownDemand
		demand += ownDemand
	}
	fillPart, burstPart, spare := 1.0, 1.0, 0.0
	if !math.IsInf(pool, 1) {
		left := pool
		part := func(ask float64) float64 {
			if ask <= 0 {
				return 0
			}
			f := min(left/ask, 1)
			left = max(left-ask*f, 0)
			return f
		}
		fillPart = part(fills)
		burstPart = part(bursts)
		if demand > 0 {
			spare = left / demand
		}
	}
	for i, c := range n.children {
		got := math.Inf(1)
		if !math.IsInf(pool, 1) {
			burst := 0.0
			if mayBurst(c.b.settings) || c.b.settings.Mode != resourcegroup.ModeEnforce {
				burst = c.sub - fill[i]
			}
			got = fill[i]*fillPart + burst*burstPart + c.sub*spare
		}
		if len(c.children) > 0 {
			sharePool(c, poolOf(c.b.settings, got), ceil)
			continue
		}
		ceil[c.b] = got
	}
	if n.own {
		if math.IsInf(pool, 1) {
			ceil[n.b] = math.Inf(1)
		} else {
			ceil[n.b] = ownDemand*burstPart + ownDemand*spare
		}
	}
}

// nestedDelta is how the count of groups with a parent changes when a
// group's settings go from was to is.
func nestedDelta(was, is Settings) int {
	d := 0
	if was.Parent != "" {
		d--
	}
	if is.Parent != "" {
		d++
	}
	return d
}
