package main

import (
	"fmt"
	"strings"
	"testing"
)

// treeOrder puts children right after their parent, deeper by one, keeps
// the listing's order among roots and among siblings, leaves a group
// whose parent is not listed a root, and cuts a cycle.
func TestConsoleTreeOrder(t *testing.T) {
	g := func(name, parent string) consoleGroup { return consoleGroup{Name: name, Parent: parent} }
	for _, tc := range []struct {
		name string
		in   []consoleGroup
		want string // name:depth, in order
	}{
		{"flat", []consoleGroup{g("b", ""), g("a", ""), g("default", "")}, "b:0 a:0 default:0"},
		// The busy child is listed before its idle parent: it moves
		// under it; the grandchild follows its parent.
		{"child before parent", []consoleGroup{g("etl", "batch"), g("web", ""), g("batch", ""), g("etl_small", "etl"), g("reports", "batch")},
			"web:0 batch:0 etl:1 etl_small:2 reports:1"},
		{"parent not listed", []consoleGroup{g("a", "gone"), g("b", "")}, "a:0 b:0"},
		{"own parent", []consoleGroup{g("a", "a")}, "a:0"},
		{"cycle", []consoleGroup{g("root", ""), g("x", "y"), g("y", "x")}, "root:0 x:0 y:1"},
		{"empty", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, x := range treeOrder(tc.in) {
				got = append(got, fmt.Sprintf("%s:%d", x.Name, x.Depth))
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("treeOrder = %q, want %q", s, tc.want)
			}
		})
	}
}
