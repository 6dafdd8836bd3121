package rgpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Overview adds the policy's counts to the token client's groups and
// lists the heaviest shapes by total RU, with their digest text only.
func TestOverviewCountsAndHeaviestShapes(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["warned"] = resourcegroup.Group{Name: "warned", RUPerSec: 10, Mode: resourcegroup.ModeWarn}
	p := newTestPolicy(tok)
	run := func(user, q string, backend time.Duration) {
		t.Helper()
		s := p.Open(mysqlproto.SessionInfo{User: user})
		st := query(q)
		if v := s.Before(ctx, st, superGrants); v.Reply != nil {
			t.Fatalf("%s: answered %+v", q, v.Reply.Err)
		}
		s.After(st, &mysqlproto.Outcome{BackendTime: backend, ResponseBytes: 100})
		s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
	}
	// Three shapes of different weight in two groups; literals differ
	// from one execution to the next.
	for i := range 3 {
		run("app", fmt.Sprintf("SELECT * FROM t WHERE secret = 'pw%d'", i), 30*time.Millisecond)
	}
	run("app", "SELECT 1", time.Millisecond)
	tok.wouldRefuse = true
	for range 2 {
		run("nobody", "SELECT /*+ RESOURCE_GROUP(warned) */ SLEEP(0.3)", 300*time.Millisecond)
	}

	o := p.Overview(10, 2)
	if o.Total != 4 || len(o.Groups) != 4 || o.CPUSource != "wall" || o.ShapesHeld != 3 {
		t.Fatalf("overview: total %d, %d groups, cpu %q, %d shapes held", o.Total, len(o.Groups), o.CPUSource, o.ShapesHeld)
	}
	byName := map[string]GroupOverview{}
	for _, g := range o.Groups {
		byName[g.Definition.Name] = g
	}
	if b := byName["bound"]; b.Statements != 4 || b.WouldThrottle != 0 {
		t.Fatalf("bound: %d statements, %d would-throttle", b.Statements, b.WouldThrottle)
	}
	if w := byName["warned"]; w.Statements != 2 || w.WouldThrottle != 2 {
		t.Fatalf("warned: %d statements, %d would-throttle", w.Statements, w.WouldThrottle)
	}
	if d := byName["default"]; d.Statements != 0 {
		t.Fatalf("default: %d statements", d.Statements)
	}
	if len(o.Shapes) != 2 {
		t.Fatalf("%d shapes, want the 2 heaviest", len(o.Shapes))
	}
	heavy, next := o.Shapes[0], o.Shapes[1]
	if heavy.Group != "warned" || !strings.Contains(heavy.DigestText, "SLEEP") || heavy.ExecCount != 2 ||
		next.Group != "bound" || next.ExecCount != 3 || heavy.TotalRU() <= next.TotalRU() {
		t.Fatalf("shapes: %+v", o.Shapes)
	}
	for _, s := range o.Shapes {
		if strings.Contains(s.DigestText, "pw") || strings.Contains(s.DigestText, "0.3") {
			t.Fatalf("a literal in a shape's text: %q", s.DigestText)
		}
	}
	if o := p.Overview(1, 0); len(o.Groups) != 1 || len(o.Shapes) != 0 || o.ShapesHeld != 3 {
		t.Fatalf("limits 1 and 0: %d groups, %d shapes", len(o.Groups), len(o.Shapes))
	}
}
