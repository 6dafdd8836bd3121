package tokenclient

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Tag bindings are cached apart from account bindings, follow PUT and
// DELETE events, and survive the cache file.
func TestTagBindingsInCache(t *testing.T) {
	dir := t.TempDir()
	c, _ := newTestClient(t, func(cfg *Config) { cfg.CacheDir = dir })
	defer c.Close()
	if c.HasTagBindings() {
		t.Fatal("tag bindings in an empty cache")
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 5, Snapshot: true, Events: []*tokenpb.WatchEvent{
		{Group: &tokenpb.ResourceGroup{Name: "rg", RuPerSec: 10}},
		{Binding: &tokenpb.Binding{User: "app", Host: "%", Group: "rg"}},
		{Binding: &tokenpb.Binding{TagKey: "route", TagValue: "/report", Group: "RG"}},
		{Binding: &tokenpb.Binding{TagKey: "a=b", TagValue: "", Group: "gone"}},
	}})
	check := func(c *Client, what string) {
		t.Helper()
		if !c.HasTagBindings() {
			t.Fatalf("%s: no tag bindings", what)
		}
		if g, ok := c.TagGroup("route", "/report"); !ok || g != "rg" {
			t.Fatalf("%s: route='/report' -> %q %v", what, g, ok)
		}
		// The group a tag names may be gone; the policy ignores it then.
		if g, ok := c.TagGroup("a=b", ""); !ok || g != "gone" {
			t.Fatalf("%s: a=b='' -> %q %v", what, g, ok)
		}
		for _, kv := range [][2]string{{"route", "/Report"}, {"Route", "/report"}, {"a", "b="}, {"app", "%"}} {
			if _, ok := c.TagGroup(kv[0], kv[1]); ok {
				t.Fatalf("%s: %q='%q' matched", what, kv[0], kv[1])
			}
		}
		// The account binding is still the account's, and only its.
		if b, ok := c.Binding("app", "%"); !ok || b.Group != "rg" {
			t.Fatalf("%s: account binding %+v %v", what, b, ok)
		}
		if c.HasBindings("") {
			t.Fatalf("%s: a tag binding counted as a user's", what)
		}
	}
	check(c, "snapshot")
	bs, err := c.Store().ListBindings(context.Background())
	want := []resourcegroup.Binding{{User: "app", Host: "%", Group: "rg"},
		{TagKey: "a=b", Group: "gone"}, {TagKey: "route", TagValue: "/report", Group: "rg"}}
	if err != nil || !reflect.DeepEqual(bs, want) {
		t.Fatalf("ListBindings:\n got  %+v %v\n want %+v", bs, err, want)
	}

	// The cache file keeps them; a proxy starting from it has them.
	c.groups.mu.Lock()
	snap := c.cache.shallow()
	c.groups.mu.Unlock()
	if err := c.saveCache(snap); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, cacheFile))
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := decodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := newTestClient(t, nil)
	defer c2.Close()
	c2.installSnapshot(loaded)
	check(c2, "cache file")

	// A DELETE carries only the tag. Every change moves the cache
	// generation, which sessions follow; a response without events does not.
	gen := c.CacheGeneration()
	c.applySettings(&tokenpb.WatchResponse{Revision: 6})
	if c.CacheGeneration() != gen {
		t.Fatal("a Watch response without events moved the cache generation")
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 6, Events: []*tokenpb.WatchEvent{
		{Type: tokenpb.WatchEvent_DELETE, Binding: &tokenpb.Binding{TagKey: "route", TagValue: "/report"}},
		{Type: tokenpb.WatchEvent_DELETE, Binding: &tokenpb.Binding{TagKey: "a=b"}},
	}})
	if c.HasTagBindings() {
		t.Fatal("tag bindings left after their DELETEs")
	}
	if c.CacheGeneration() == gen {
		t.Fatal("the DELETEs left the cache generation as it was")
	}
	if _, ok := c.Binding("app", "%"); !ok {
		t.Fatal("a tag's DELETE removed the account binding")
	}
}

// Binding a tag through the Store waits until the settings cache has it.
func TestTagBindingOverGRPC(t *testing.T) {
	s := startServer(t)
	c, _ := startClient(t, nil, s.addr)
	st := c.Store()
	ctx := context.Background()
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "rg", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	s.rg.setHold(true)
	done := make(chan error, 1)
	go func() { done <- st.BindUser(ctx, resourcegroup.Binding{TagKey: "route", TagValue: "/r", Group: "RG"}) }()
	waitFor(t, "the bind to reach the server", func() bool {
		s.rg.mu.Lock()
		defer s.rg.mu.Unlock()
		return len(s.rg.bindings) == 1
	}, nil)
	if c.HasTagBindings() {
		t.Fatal("tag binding visible although the Watch was held")
	}
	s.rg.setHold(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if g, ok := c.TagGroup("route", "/r"); !ok || g != "rg" {
		t.Fatalf("after BindUser returned: %q %v", g, ok)
	}
}

// FuzzDecodeSnapshotTags: a cache file's tag bindings come back keyed by
// their tag, valid, and never as an account's.
func FuzzDecodeSnapshotTags(f *testing.F) {
	f.Add([]byte(`{"tags":{"route=%2Fr":{"TagKey":"route","TagValue":"/r","Group":"RG"}}}`))
	f.Add([]byte(`{"tags":{"x":{"TagKey":"","Group":"g"}},"bindings":{"@":{"TagKey":"k","Group":"g"}}}`))
	f.Add([]byte(`{"tags":{"k=v":{"User":"u","Host":"%","TagKey":"k","TagValue":"v","Group":"g"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		for key, b := range snap.Tags {
			if key != b.Tag() || b.User != "" || b.Host != "" || resourcegroup.ValidateTag(b.TagKey, b.TagValue) != nil {
				t.Fatalf("tag key %q: %+v", key, b)
			}
		}
		for key, b := range snap.Bindings {
			if b.IsTag() {
				t.Fatalf("tag binding %+v among the accounts' under %q", b, key)
			}
		}
	})
}
