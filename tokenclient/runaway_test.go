package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func watchStoreOf(t *testing.T, c *Client) resourcegroup.WatchStore {
	t.Helper()
	ws, ok := c.Store().(resourcegroup.WatchStore)
	if !ok {
		t.Fatal("Store() does not implement resourcegroup.WatchStore")
	}
	return ws
}

// Watches added through one client's Store are matched by it at once
// (read-your-writes) and reach another client through the Watch stream;
// they stop matching when they expire by the injected clock, and leave the
// cache when rgserver deletes them.
func TestWatchCacheMatchAndExpiry(t *testing.T) {
	s := startServer(t)
	c, clk := startClient(t, func(cfg *Config) { cfg.AdminToken = "secret" }, s.addr)
	c2, _ := startClient(t, nil, s.addr)
	st := watchStoreOf(t, c)
	ctx := context.Background()
	if e, sim := c.HasWatches(); e || sim {
		t.Fatalf("HasWatches before any watch: %v %v", e, sim)
	}

	exact, err := st.AddWatch(ctx, resourcegroup.Watch{Group: "RG1", Match: resourcegroup.WatchExact,
		Text: "SELECT SLEEP(5)", Action: resourcegroup.ActionKill, Source: resourcegroup.WatchSourceManual,
		Created: clk.Now(), Expires: clk.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if exact.ID == 0 || exact.Group != "rg1" {
		t.Fatalf("added %+v", exact)
	}
	similar, err := st.AddWatch(ctx, resourcegroup.Watch{Group: "rg2", Match: resourcegroup.WatchSimilar,
		Text: "digest-1", Action: resourcegroup.ActionSwitchGroup, SwitchGroup: "RG1", Source: "proxy-9"})
	if err != nil {
		t.Fatal(err)
	}
	if e, sim := c.HasWatches(); !e || !sim {
		t.Fatalf("HasWatches with an EXACT and a SIMILAR watch: %v %v", e, sim)
	}
	if dup, err := st.AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchExact, Text: "SELECT SLEEP(5)"}); err != nil || dup.ID != exact.ID {
		t.Fatalf("duplicate add = %+v, %v", dup, err)
	}
	s.rg.mu.Lock()
	auth := append([]string(nil), s.rg.auth...)
	s.rg.mu.Unlock()
	if len(auth) != 3 || auth[0] != "Bearer secret" {
		t.Fatalf("authorization sent: %q", auth)
	}

	match := []struct {
		name, group, text, digest string
		want                      uint64 // 0 = no match
	}{
		{"exact text", "", "SELECT SLEEP(5)", "", exact.ID},
		{"exact text wins over digest", "", "SELECT SLEEP(5)", "digest-1", exact.ID},
		{"text differs in case", "", "select sleep(5)", "", 0},
		{"digest", "", "SELECT SLEEP(6)", "digest-1", similar.ID},
		{"digest only", "", "", "digest-1", similar.ID},
		{"text is not a digest", "", "digest-1", "", 0},
		{"nothing", "", "", "", 0},
		{"group filter hit", "RG1", "SELECT SLEEP(5)", "", exact.ID},
		{"group filter miss", "rg2", "SELECT SLEEP(5)", "", 0},
		{"group filter digest", "rg2", "SELECT SLEEP(5)", "digest-1", similar.ID},
	}
	for _, tc := range match {
		w, ok := c.MatchGroupWatch(tc.group, tc.text, tc.digest)
		if tc.want == 0 && ok || tc.want != 0 && (!ok || w.ID != tc.want) {
			t.Errorf("%s: MatchGroupWatch(%q, %q, %q) = %+v, %v; want id %d", tc.name, tc.group, tc.text, tc.digest, w, ok, tc.want)
		}
		if tc.group == "" {
			if w2, ok2 := c.MatchWatch(tc.text, tc.digest); ok2 != ok || w2 != w {
				t.Errorf("%s: MatchWatch disagrees: %+v %v", tc.name, w2, ok2)
			}
		}
	}
	if w, _ := c.MatchWatch("", "digest-1"); w.SwitchGroup != "rg1" || w.Action != resourcegroup.ActionSwitchGroup || w.Source != "proxy-9" {
		t.Fatalf("matched watch lost fields: %+v", w)
	}

	// The other proxy gets both through its Watch stream.
	waitFor(t, "the second client's cache", func() bool { return len(c2.Watches()) == 2 }, nil)
	if w, ok := c2.MatchWatch("SELECT SLEEP(5)", ""); !ok || w.ID != exact.ID || !w.Expires.Equal(exact.Expires) {
		t.Fatalf("second client match = %+v, %v", w, ok)
	}

	// Expiry by the clock: one millisecond before it still matches.
	clk.Advance(time.Minute - time.Millisecond)
	if _, ok := c.MatchWatch("SELECT SLEEP(5)", ""); !ok {
		t.Fatal("watch expired early")
	}
	clk.Advance(time.Millisecond)
	if w, ok := c.MatchWatch("SELECT SLEEP(5)", ""); ok {
		t.Fatalf("expired watch matched: %+v", w)
	}
	if ws := c.Watches(); len(ws) != 1 || ws[0].ID != similar.ID {
		t.Fatalf("live watches after expiry = %+v", ws)
	}
	if ws, err := st.ListWatches(ctx); err != nil || len(ws) != 1 || ws[0].ID != similar.ID {
		t.Fatalf("ListWatches after expiry = %+v, %v", ws, err)
	}
	// rgserver deleting the entry (its lease ran out) empties the cache.
	s.rg.expireWatch(exact.ID)
	waitFor(t, "the expired entry to leave the cache", func() bool {
		var ok bool
		c.cache.read(func(s *snapshot) { _, ok = s.Watches[exact.ID] })
		return !ok
	}, nil)

	if err := st.RemoveWatch(ctx, similar.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.MatchWatch("", "digest-1"); ok {
		t.Fatal("removed watch still matches on the proxy that removed it")
	}
	err = st.RemoveWatch(ctx, similar.ID)
	var re *resourcegroup.Error
	if !errors.Is(err, resourcegroup.ErrWatchNotFound) || !errors.As(err, &re) || re.Code != resourcegroup.CodeUnknown {
		t.Fatalf("second remove = %v", err)
	}
	if _, err := st.AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchExact}); !errors.Is(err, resourcegroup.ErrInvalid) {
		t.Fatalf("empty text = %v, want ErrInvalid", err)
	}
}

// AddWatch and RemoveWatch return only once the settings cache shows them (at
// most 1 s).
func TestWatchStoreReadYourWrites(t *testing.T) {
	s := startServer(t)
	c, _ := startClient(t, nil, s.addr)
	st := watchStoreOf(t, c)
	ctx := context.Background()

	s.rg.setHold(true)
	done := make(chan error, 1)
	go func() {
		_, err := st.AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchExact, Text: "q"})
		done <- err
	}()
	waitFor(t, "the add to reach the server", func() bool {
		s.rg.mu.Lock()
		defer s.rg.mu.Unlock()
		return len(s.rg.watches) == 1
	}, nil)
	time.Sleep(20 * time.Millisecond) // give a store that does not wait the chance to return
	select {
	case err := <-done:
		t.Fatalf("AddWatch returned before the cache caught up: %v", err)
	default:
	}
	s.rg.setHold(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := c.MatchWatch("q", ""); !ok {
		t.Fatal("added watch does not match")
	}
}

// A snapshot replaces the whole watch list; events add and delete entries;
// names are normalized.
func TestApplyWatchEvents(t *testing.T) {
	c, _ := newTestClient(t, nil)
	put := func(id uint64, text string) *tokenpb.WatchEvent {
		return &tokenpb.WatchEvent{Watch: &tokenpb.RunawayWatch{Id: id, Group: "RG", Match: tokenpb.WatchType_WATCH_EXACT, Text: text}}
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 1, Snapshot: true, Events: []*tokenpb.WatchEvent{put(1, "a"), put(2, "b"), put(0, "no id")}})
	if ws := c.Watches(); len(ws) != 2 || ws[0].ID != 1 || ws[0].Group != "rg" || ws[1].ID != 2 {
		t.Fatalf("after snapshot: %+v", ws)
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 2, Events: []*tokenpb.WatchEvent{
		{Type: tokenpb.WatchEvent_DELETE, Watch: &tokenpb.RunawayWatch{Id: 1}}, put(3, "c")}})
	if _, ok := c.MatchWatch("a", ""); ok {
		t.Fatal("deleted watch matches")
	}
	if w, ok := c.MatchWatch("c", ""); !ok || w.ID != 3 {
		t.Fatalf("added watch: %+v %v", w, ok)
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 3, Snapshot: true, Events: []*tokenpb.WatchEvent{put(9, "z")}})
	if ws := c.Watches(); len(ws) != 1 || ws[0].ID != 9 {
		t.Fatalf("a snapshot must replace the list: %+v", ws)
	}
	// Two watches on one text (two groups): the lowest id wins, the group
	// filter picks its own.
	c.applySettings(&tokenpb.WatchResponse{Revision: 4, Events: []*tokenpb.WatchEvent{
		{Watch: &tokenpb.RunawayWatch{Id: 12, Group: "b", Match: tokenpb.WatchType_WATCH_SIMILAR, Text: "d"}},
		{Watch: &tokenpb.RunawayWatch{Id: 11, Group: "a", Match: tokenpb.WatchType_WATCH_SIMILAR, Text: "d"}},
	}})
	if w, _ := c.MatchWatch("", "d"); w.ID != 11 {
		t.Fatalf("lowest id should win: %+v", w)
	}
	if w, _ := c.MatchGroupWatch("B", "", "d"); w.ID != 12 {
		t.Fatalf("group filter: %+v", w)
	}
}

// MatchWatch runs on every statement while the cache changes: no race.
func TestMatchWatchConcurrentWithUpdates(t *testing.T) {
	c, _ := newTestClient(t, nil)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					c.MatchWatch("q", "d")
				}
			}
		}()
	}
	for i := range 200 {
		c.applySettings(&tokenpb.WatchResponse{Revision: int64(i + 1), Events: []*tokenpb.WatchEvent{
			{Watch: &tokenpb.RunawayWatch{Id: uint64(i + 1), Group: "g", Match: tokenpb.WatchType_WATCH_EXACT, Text: fmt.Sprint(i)}}}})
	}
	close(stop)
	wg.Wait()
	if len(c.Watches()) != 200 {
		t.Fatalf("watches = %d", len(c.Watches()))
	}
}

// The watch list is kept in the cache-dir snapshot and served from it when
// rgserver is down at start.
func TestWatchesInCacheDir(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t)
	c1, _ := startClient(t, func(cfg *Config) { cfg.CacheDir = dir }, s.addr)
	ctx := context.Background()
	w, err := watchStoreOf(t, c1).AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchSimilar, Text: "dg"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot file", func() bool {
		data, err := os.ReadFile(filepath.Join(dir, cacheFile))
		if err != nil {
			return false
		}
		snap, err := decodeSnapshot(data)
		return err == nil && snap.Watches[w.ID].Text == "dg"
	}, nil)
	c1.Close()

	c2, _ := startClient(t, func(cfg *Config) { cfg.CacheDir = dir }, deadAddr(t))
	if got, ok := c2.MatchWatch("", "dg"); !ok || got.ID != w.ID || got.Group != "rg1" {
		t.Fatalf("watch from the cache: %+v %v", got, ok)
	}
}
