package rgpolicy

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

func killRule(ru uint64) *resourcegroup.QueryLimit {
	return &resourcegroup.QueryLimit{RU: ru, Action: resourcegroup.ActionKill}
}

// Without a service account a KILL rule's runaway is counted as
// KILL_UNENFORCED and logged at ERROR, never as a KILL that did not kill.
func TestPolicyKillWithoutServiceAccountIsUnenforced(t *testing.T) {
	tok := testGroups()
	tok.groups["k"] = resourcegroup.Group{Name: "k", RUPerSec: 1000, QueryLimit: killRule(10)}
	var logs bytes.Buffer
	p, err := New(Config{Tokens: tok, Settings: Settings{MaxWait: time.Second}, CPU: CPUWall,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	st := query("SELECT /*+ RESOURCE_GROUP(k) */ * FROM big")
	if v := s.Before(context.Background(), st, superGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	s.(mysqlproto.ProgressObserver).Progress(st, 1<<20) // 16 RU: over
	s.After(st, &mysqlproto.Outcome{ResponseBytes: 1 << 20})
	for action, want := range map[string]float64{"KILL_UNENFORCED": 1, "KILL": 0} {
		if n := testutil.ToFloat64(p.metrics.runaway.WithLabelValues("k", action)); n != want {
			t.Errorf("rgproxy_runaway_total{action=%q} = %v, want %v", action, n, want)
		}
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "resource_group=k") ||
		!strings.Contains(logs.String(), "--admin-user") {
		t.Fatalf("no ERROR naming the group and what to do:\n%s", logs.String())
	}
}

// The groups with a KILL rule are listed, gauged and logged once each
// while they exist; a dropped group loses its gauge.
func TestPolicyTracksUnenforcedGroups(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	st := tok.Store()
	for _, g := range []resourcegroup.Group{
		{Name: "k1", RUPerSec: 10, QueryLimit: killRule(100)},
		{Name: "dry", RUPerSec: 10, QueryLimit: &resourcegroup.QueryLimit{RU: 100, Action: resourcegroup.ActionDryRun}},
	} {
		if err := st.CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	p, err := New(Config{Tokens: tok, CPU: CPUWall, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		change func() error
		want   []string
		logged string // a new ERROR line naming these, "" = none
	}{
		{"at start", func() error { return nil }, []string{"k1"}, "resource_groups=[k1]"},
		{"unchanged", func() error { return nil }, []string{"k1"}, ""},
		{"a KILL group appears", func() error {
			return st.CreateGroup(ctx, resourcegroup.Group{Name: "k2", RUPerSec: 10, QueryLimit: killRule(5)})
		}, []string{"k1", "k2"}, "resource_groups=[k2]"},
		{"one is dropped", func() error { return st.DropGroup(ctx, "k1") }, []string{"k2"}, ""},
	}
	for _, step := range steps {
		if err := step.change(); err != nil {
			t.Fatal(err)
		}
		logs.Reset()
		p.checkEnforcement(ctx)
		if got := p.QueryLimitUnenforced(); !slices.Equal(got, step.want) {
			t.Errorf("%s: unenforced %v, want %v", step.name, got, step.want)
		}
		if n := testutil.CollectAndCount(p.metrics.unenforced); n != len(step.want) {
			t.Errorf("%s: %d series of rgproxy_query_limit_unenforced, want %d", step.name, n, len(step.want))
		}
		for _, g := range step.want {
			if testutil.ToFloat64(p.metrics.unenforced.WithLabelValues(g)) != 1 {
				t.Errorf("%s: gauge of %s not 1", step.name, g)
			}
		}
		switch out := logs.String(); {
		case step.logged == "" && out != "":
			t.Errorf("%s: logged %s", step.name, out)
		case step.logged != "" && (!strings.Contains(out, "level=ERROR") || !strings.Contains(out, step.logged)):
			t.Errorf("%s: want an ERROR with %s, got %s", step.name, step.logged, out)
		}
	}
}
