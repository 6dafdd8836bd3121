package resourcegroup

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestMemStoreWatches(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewMemStore()
	s.SetClock(func() time.Time { return now })
	if err := s.CreateGroup(ctx, Group{Name: "rg1", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []Watch{
		{Group: "nope", Match: WatchExact, Text: "x"},
		{Group: "rg1", Match: WatchExact, Text: "x", Action: ActionSwitchGroup, SwitchGroup: "nope"},
	} {
		if _, err := s.AddWatch(ctx, w); !errors.Is(err, ErrNotFound) {
			t.Fatalf("AddWatch(%+v) = %v, want ErrNotFound", w, err)
		}
	}

	a, err := s.AddWatch(ctx, Watch{Group: "RG1", Match: WatchExact, Text: "select 1", Source: WatchSourceManual,
		Expires: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != 1 || a.Group != "rg1" || !a.Created.Equal(now) {
		t.Fatalf("first watch = %+v", a)
	}
	dup, err := s.AddWatch(ctx, Watch{Group: "rg1", Match: WatchExact, Text: "select 1", Source: "proxy-2"})
	if err != nil || dup.ID != a.ID || dup.Source != WatchSourceManual {
		t.Fatalf("duplicate add = %+v, %v; want the existing watch %d", dup, err, a.ID)
	}
	b, err := s.AddWatch(ctx, Watch{Group: "rg1", Match: WatchSimilar, Text: "select 1", Action: ActionKill})
	if err != nil || b.ID != 2 {
		t.Fatalf("similar watch = %+v, %v", b, err)
	}
	ws, _ := s.ListWatches(ctx)
	if len(ws) != 2 || ws[0].ID != 1 || ws[1].ID != 2 {
		t.Fatalf("list = %+v", ws)
	}

	now = now.Add(time.Minute) // a expires exactly now
	ws, _ = s.ListWatches(ctx)
	if len(ws) != 1 || ws[0].ID != 2 {
		t.Fatalf("list after expiry = %+v", ws)
	}
	if err := s.RemoveWatch(ctx, a.ID); !errors.Is(err, ErrWatchNotFound) {
		t.Fatalf("remove expired = %v, want ErrWatchNotFound", err)
	}
	c, err := s.AddWatch(ctx, Watch{Group: "rg1", Match: WatchExact, Text: "select 1"})
	if err != nil || c.ID != 3 {
		t.Fatalf("re-add after expiry = %+v, %v; want a new id 3", c, err)
	}
	if err := s.RemoveWatch(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	var rgErr *Error
	if err := s.RemoveWatch(ctx, b.ID); !errors.As(err, &rgErr) || rgErr.Code != CodeUnknown || !errors.Is(err, ErrWatchNotFound) {
		t.Fatalf("second remove = %v", err)
	}
}

func TestWatchValidate(t *testing.T) {
	now := time.Unix(1000, 0)
	ok := Watch{Group: "rg", Match: WatchExact, Text: "x"}
	tests := []struct {
		name  string
		edit  func(*Watch)
		valid bool
	}{
		{"ok", func(*Watch) {}, true},
		{"switch", func(w *Watch) { w.Action, w.SwitchGroup = ActionSwitchGroup, "rg2" }, true},
		{"no group", func(w *Watch) { w.Group = "" }, false},
		{"no match", func(w *Watch) { w.Match = WatchNone }, false},
		{"bad match", func(w *Watch) { w.Match = 9 }, false},
		{"no text", func(w *Watch) { w.Text = "" }, false},
		{"bad action", func(w *Watch) { w.Action = 9 }, false},
		{"switch to self", func(w *Watch) { w.Action, w.SwitchGroup = ActionSwitchGroup, "rg" }, false},
		{"switch without target", func(w *Watch) { w.Action = ActionSwitchGroup }, false},
		{"target without switch", func(w *Watch) { w.Action, w.SwitchGroup = ActionKill, "rg2" }, false},
		{"expires before created", func(w *Watch) { w.Created, w.Expires = now, now }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := ok
			tt.edit(&w)
			err := w.Validate()
			if (err == nil) != tt.valid {
				t.Fatalf("Validate(%+v) = %v, want valid=%v", w, err, tt.valid)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestWatchLive(t *testing.T) {
	now := time.Unix(1000, 0)
	if !(Watch{}).Live(now) {
		t.Fatal("a watch without Expires must be live")
	}
	w := Watch{Expires: now.Add(time.Second)}
	if !w.Live(now) || w.Live(now.Add(time.Second)) {
		t.Fatal("Live must hold strictly before Expires")
	}
}
