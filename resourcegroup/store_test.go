package resourcegroup

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

func TestMemStoreGroups(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	d, err := s.GetGroup(ctx, "DEFAULT")
	if err != nil || d.Name != DefaultGroup || d.RUPerSec != Unlimited || d.Burst != BurstUnlimited || d.Version == 0 {
		t.Fatalf("default = %+v, %v", d, err)
	}
	if err := s.CreateGroup(ctx, Group{Name: "RG1", RUPerSec: 100, QueryLimit: &QueryLimit{RU: 5, Action: ActionKill}}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateGroup(ctx, Group{Name: "rg1", RUPerSec: 100}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate create = %v, want ErrExists", err)
	}
	if err := s.CreateGroup(ctx, Group{Name: "bad", RUPerSec: 0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid create = %v, want ErrInvalid", err)
	}
	g, err := s.GetGroup(ctx, "rg1")
	if err != nil || g.RUPerSec != 100 {
		t.Fatalf("get = %+v, %v", g, err)
	}
	// The returned copy must not alias the stored QueryLimit.
	g.QueryLimit.RU = 999
	if again, _ := s.GetGroup(ctx, "rg1"); again.QueryLimit.RU != 5 {
		t.Fatalf("store shares QueryLimit with callers")
	}
	stale := g.Version
	g.RUPerSec = 200
	g.QueryLimit.RU = 5
	if err := s.AlterGroup(ctx, g); err != nil {
		t.Fatal(err)
	}
	g2, _ := s.GetGroup(ctx, "rg1")
	if g2.RUPerSec != 200 || g2.Version <= stale {
		t.Fatalf("after alter: %+v (old version %d)", g2, stale)
	}
	g.Version = stale
	if err := s.AlterGroup(ctx, g); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale alter = %v, want ErrConflict", err)
	}
	g.Version = 0 // unconditional
	if err := s.AlterGroup(ctx, g); err != nil {
		t.Fatalf("unconditional alter: %v", err)
	}
	if err := s.AlterGroup(ctx, Group{Name: "nope", RUPerSec: 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("alter missing = %v", err)
	}
	if err := s.AlterGroup(ctx, Group{Name: "rg1"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("alter invalid = %v", err)
	}
	list, _ := s.ListGroups(ctx)
	if len(list) != 2 || list[0].Name != "default" || list[1].Name != "rg1" {
		t.Fatalf("list = %+v", list)
	}
	if err := s.DropGroup(ctx, "Default"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("drop default = %v", err)
	}
	if err := s.DropGroup(ctx, "rg1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DropGroup(ctx, "rg1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("drop twice = %v", err)
	}
	if _, err := s.GetGroup(ctx, "rg1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get dropped = %v", err)
	}
}

func TestMemStoreBindings(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	if err := s.BindUser(ctx, Binding{User: "app", Host: "%", Group: "rg1"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bind to missing group = %v", err)
	}
	if err := s.CreateGroup(ctx, Group{Name: "rg1", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	if err := s.BindUser(ctx, Binding{User: "app", Host: "10.%", Group: "RG1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.BindUser(ctx, Binding{User: "zed", Host: "%", Group: "rg1"}); err != nil {
		t.Fatal(err)
	}
	b, err := s.GetBinding(ctx, "app", "10.%")
	if err != nil || b != (Binding{User: "app", Host: "10.%", Group: "rg1"}) {
		t.Fatalf("binding = %+v, %v", b, err)
	}
	// Another account of the same user name is not bound.
	if _, err := s.GetBinding(ctx, "app", "%"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("'app'@'%%' got 'app'@'10.%%''s binding: %v", err)
	}
	bs, _ := s.ListBindings(ctx)
	if len(bs) != 2 || bs[0].User != "app" || bs[1].User != "zed" {
		t.Fatalf("list = %+v", bs)
	}
	// Binding to default is unbinding.
	if err := s.BindUser(ctx, Binding{User: "app", Host: "10.%", Group: "default"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetBinding(ctx, "app", "10.%"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after bind to default = %v, want ErrNotFound", err)
	}
	if err := s.UnbindUser(ctx, "zed", "%"); err != nil {
		t.Fatal(err)
	}
	if err := s.UnbindUser(ctx, "zed", "%"); err != nil {
		t.Fatalf("unbind twice: %v", err)
	}
	if bs, _ := s.ListBindings(ctx); len(bs) != 0 {
		t.Fatalf("bindings left: %+v", bs)
	}
}

func TestMemStoreTagBindings(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	if err := s.BindUser(ctx, Binding{TagKey: "route", TagValue: "/r", Group: "rg1"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("bind to missing group = %v", err)
	}
	if err := s.BindUser(ctx, Binding{TagKey: "k", TagValue: string([]byte{0xff}), Group: "default"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid UTF-8 = %v", err)
	}
	if err := s.CreateGroup(ctx, Group{Name: "rg1", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []Binding{
		{TagKey: "route", TagValue: "/r", Group: "RG1"},
		{TagKey: "app", TagValue: "x", Group: "rg1"},
		{User: "zed", Host: "%", Group: "rg1"},
		// User and Host of a tag binding are dropped.
		{User: "u", Host: "h", TagKey: "app", TagValue: "a", Group: "rg1"},
	} {
		if err := s.BindUser(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	bs, _ := s.ListBindings(ctx)
	want := []Binding{{User: "zed", Host: "%", Group: "rg1"}, {TagKey: "app", TagValue: "a", Group: "rg1"},
		{TagKey: "app", TagValue: "x", Group: "rg1"}, {TagKey: "route", TagValue: "/r", Group: "rg1"}}
	if !reflect.DeepEqual(bs, want) {
		t.Fatalf("list:\n got  %+v\n want %+v", bs, want)
	}
	// A tag binding is no account's.
	if _, err := s.GetBinding(ctx, "", ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetBinding of the empty account: %v", err)
	}
	if err := s.BindUser(ctx, Binding{TagKey: "route", TagValue: "/r", Group: "default"}); err != nil {
		t.Fatal(err)
	}
	if bs, _ := s.ListBindings(ctx); len(bs) != 3 || bs[2].TagKey != "app" {
		t.Fatalf("after unbinding the tag: %+v", bs)
	}
}

func TestMemStoreCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := NewMemStore()
	calls := map[string]error{
		"create": s.CreateGroup(ctx, Group{Name: "x", RUPerSec: 1}),
		"alter":  s.AlterGroup(ctx, DefaultGroupDefinition()),
		"drop":   s.DropGroup(ctx, "x"),
		"bind":   s.BindUser(ctx, Binding{User: "u", Group: "default"}),
		"unbind": s.UnbindUser(ctx, "u", "%"),
	}
	_, calls["get"] = s.GetGroup(ctx, "default")
	_, calls["list"] = s.ListGroups(ctx)
	_, calls["getb"] = s.GetBinding(ctx, "u", "%")
	_, calls["listb"] = s.ListBindings(ctx)
	for name, err := range calls {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context = %v", name, err)
		}
	}
}

// TestMemStoreConcurrentAlter runs Execute's read-modify-write from many
// goroutines; with -race it also checks the store's locking. Every ALTER
// must land (retries absorb conflicts) and the versions must only grow.
func TestMemStoreConcurrentAlter(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("g%d", i)
			if err := s.CreateGroup(ctx, Group{Name: name, RUPerSec: 1}); err != nil {
				errs <- err
				return
			}
			for j := 1; j <= 20; j++ {
				st := &AlterGroup{Name: name, Fields: FieldRUPerSec | FieldQueryLimit, Options: Group{RUPerSec: uint64(j), QueryLimit: &QueryLimit{ExecElapsed: time.Duration(j) * time.Second, Action: ActionKill}}}
				if _, err := Execute(ctx, st, s); err != nil {
					errs <- err
					return
				}
			}
			if _, err := s.ListGroups(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	list, _ := s.ListGroups(ctx)
	if len(list) != 9 {
		t.Fatalf("%d groups, want 9", len(list))
	}
	for _, g := range list[1:] {
		if g.RUPerSec != 20 || g.QueryLimit.ExecElapsed != 20*time.Second {
			t.Errorf("%s = %+v", g.Name, g)
		}
	}
}

// conflictStore fails the first n AlterGroup calls with ErrConflict, to
// check that Execute retries and then gives up.
type conflictStore struct {
	*MemStore
	n int
}

func (c *conflictStore) AlterGroup(ctx context.Context, g Group) error {
	if c.n > 0 {
		c.n--
		return NewConflict(g.Name, g.Version, g.Version+1)
	}
	return c.MemStore.AlterGroup(ctx, g)
}

func TestAlterRetries(t *testing.T) {
	ctx := context.Background()
	st := &AlterGroup{Name: "default", Fields: FieldPriority, Options: Group{Priority: PriorityHigh}}
	ok := &conflictStore{MemStore: NewMemStore(), n: alterRetries - 1}
	if _, err := Execute(ctx, st, ok); err != nil {
		t.Fatalf("with %d conflicts: %v", alterRetries-1, err)
	}
	if g, _ := ok.GetGroup(ctx, "default"); g.Priority != PriorityHigh {
		t.Fatalf("priority not applied: %+v", g)
	}
	bad := &conflictStore{MemStore: NewMemStore(), n: alterRetries}
	if _, err := Execute(ctx, st, bad); !errors.Is(err, ErrConflict) {
		t.Fatalf("with %d conflicts = %v, want ErrConflict", alterRetries, err)
	}
}
