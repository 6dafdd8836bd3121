package resourcegroup

import (
	"context"
	"fmt"
	"strconv"
)

// Groups inside groups: PARENT = p puts a group under p, whose
// RU_PER_SEC then holds over the sum of its children (and its own
// statements), rgserver sharing it as the service limit is shared
// (docs/design.md §7.6). The tree is checked where a statement changes
// it, against the groups as listed: a group cannot be its own parent or
// its own ancestor, the parent must exist, the tree is at most MaxDepth
// levels deep, a child's RU_PER_SEC is at most its parent's (a child
// above its parent could never have its rate), and a group with
// children cannot be dropped. Two concurrent statements may each pass
// the checks and together break them (the checks read, then write); the
// allocator copes with any tree: it stops its walk up after MaxDepth
// levels, and a parent's rate still holds over its children.

// checkTree checks g's place in the tree of groups: its parent, its
// depth, and its RU_PER_SEC against its parent's and its children's.
func checkTree(ctx context.Context, g Group, store Store) error {
	groups, err := store.ListGroups(ctx)
	if err != nil {
		return err
	}
	byName := make(map[string]Group, len(groups)+1)
	for _, x := range groups {
		byName[x.Name] = x
	}
	byName[g.Name] = g
	// Its children (for an ALTER) and the height of its subtree.
	var children []Group
	for _, x := range groups {
		if x.Parent == g.Name && x.Name != g.Name {
			children = append(children, x)
		}
	}
	for _, c := range children {
		if g.RUPerSec < c.RUPerSec {
			return NewInvalid(fmt.Sprintf("%s: RU_PER_SEC = %s of resource group '%s' is below RU_PER_SEC = %s of its child '%s'; "+
				"a parent's RU_PER_SEC holds over its children together, each at most the parent's",
				msgInvalidSetting, ruText(g.RUPerSec), g.Name, ruText(c.RUPerSec), c.Name))
		}
	}
	if g.Parent == "" {
		if h := height(g.Name, byName); h > MaxDepth {
			return errDepth(g.Name, h)
		}
		return nil
	}
	if g.Parent == g.Name {
		return NewInvalid(fmt.Sprintf("%s: resource group '%s' cannot be its own PARENT", msgInvalidSetting, g.Name))
	}
	p, ok := byName[g.Parent]
	if !ok {
		return NewInvalid(fmt.Sprintf("%s: PARENT resource group '%s' does not exist", msgInvalidSetting, g.Parent))
	}
	// The walk up from the parent: g met again is a cycle.
	depth := 1
	for x := p; ; {
		if x.Name == g.Name {
			return NewInvalid(fmt.Sprintf("%s: PARENT = '%s' would make resource group '%s' its own ancestor",
				msgInvalidSetting, g.Parent, g.Name))
		}
		depth++
		if depth > MaxDepth+1 || x.Parent == "" {
			break
		}
		next, ok := byName[x.Parent]
		if !ok {
			break
		}
		x = next
	}
	if d := depth - 1 + height(g.Name, byName); d > MaxDepth {
		return errDepth(g.Name, d)
	}
	if g.RUPerSec > p.RUPerSec {
		return NewInvalid(fmt.Sprintf("%s: RU_PER_SEC = %s of resource group '%s' is above RU_PER_SEC = %s of its PARENT '%s'; "+
			"a parent's RU_PER_SEC holds over its children together, so a child gets at most the parent's "+
			"(BURSTABLE = UNLIMITED with a lower RU_PER_SEC lets a child use what its siblings leave)",
			msgInvalidSetting, ruText(g.RUPerSec), g.Name, ruText(p.RUPerSec), p.Name))
	}
	return nil
}

// height is the number of levels of name's subtree in byName (1: no
// children), counted up to MaxDepth + 1.
func height(name string, byName map[string]Group) int {
	best := 1
	var walk func(n string, level int)
	walk = func(n string, level int) {
		best = max(best, level)
		if level > MaxDepth {
			return
		}
		for _, x := range byName {
			if x.Parent == n && x.Name != n {
				walk(x.Name, level+1)
			}
		}
	}
	walk(name, 1)
	return best
}

// errDepth is 1105 for a tree deeper than MaxDepth.
func errDepth(name string, levels int) *Error {
	return NewInvalid(fmt.Sprintf("%s: PARENT would put resource group '%s' in a tree %d levels deep; at most %s levels "+
		"(a group, its parent and its parent's parent) are allowed", msgInvalidSetting, name, levels, strconv.Itoa(MaxDepth)))
}

// checkNoChildren refuses to drop a group that is another's PARENT: its
// children would lose the limit they share without a word.
func checkNoChildren(ctx context.Context, name string, store Store) error {
	groups, err := store.ListGroups(ctx)
	if err != nil {
		return err
	}
	for _, g := range groups {
		if g.Parent == name && g.Name != name {
			return NewInvalid(fmt.Sprintf("%s: resource group '%s' is the PARENT of resource group '%s'; "+
				"move or detach its children first (ALTER RESOURCE GROUP %s PARENT = NULL)",
				msgDropSwitchTarget, name, g.Name, QuoteName(g.Name)))
		}
	}
	return nil
}
