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

// Digest bindings are cached apart from the others, indexed by hash for
// DigestGroup, follow PUT and DELETE events, and survive the cache file;
// a bad digest from the wire or the file is skipped.
func TestDigestBindingsInCache(t *testing.T) {
	dir := t.TempDir()
	c, _ := newTestClient(t, func(cfg *Config) { cfg.CacheDir = dir })
	defer c.Close()
	if c.cache.digestIdx.Load() != nil {
		t.Fatal("a digest index in an empty cache")
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 5, Snapshot: true, Events: []*tokenpb.WatchEvent{
		{Group: &tokenpb.ResourceGroup{Name: "rg", RuPerSec: 10}},
		{Binding: &tokenpb.Binding{User: "app", Host: "%", Group: "rg"}},
		{Binding: &tokenpb.Binding{Digest: "00AB34CD56EF7890", Group: "RG"}},
		{Binding: &tokenpb.Binding{Digest: "ffffffffffffffff", Group: "gone"}},
		{Binding: &tokenpb.Binding{Digest: "not a digest", Group: "rg"}},
	}})
	check := func(c *Client, what string) {
		t.Helper()
		if g, ok := c.DigestGroup(0x00ab34cd56ef7890); !ok || g != "rg" {
			t.Fatalf("%s: 00ab34cd56ef7890 -> %q %v", what, g, ok)
		}
		if g, ok := c.DigestGroup(0xffffffffffffffff); !ok || g != "gone" {
			t.Fatalf("%s: ffffffffffffffff -> %q %v", what, g, ok)
		}
		if g, ok := c.DigestGroup(0x00ab34cd56ef7891); ok {
			t.Fatalf("%s: another digest matched %q", what, g)
		}
		if b, ok := c.Binding("app", "%"); !ok || b.Group != "rg" || c.HasBindings("") || c.HasTagBindings() {
			t.Fatalf("%s: account binding %+v %v, or a digest counted as another kind", what, b, ok)
		}
	}
	check(c, "snapshot")
	bs, err := c.Store().ListBindings(context.Background())
	want := []resourcegroup.Binding{{User: "app", Host: "%", Group: "rg"},
		{Digest: "00ab34cd56ef7890", Group: "rg"}, {Digest: "ffffffffffffffff", Group: "gone"}}
	if err != nil || !reflect.DeepEqual(bs, want) {
		t.Fatalf("ListBindings:\n got  %+v %v\n want %+v", bs, err, want)
	}

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

	gen := c.CacheGeneration()
	c.applySettings(&tokenpb.WatchResponse{Revision: 6, Events: []*tokenpb.WatchEvent{
		{Type: tokenpb.WatchEvent_DELETE, Binding: &tokenpb.Binding{Digest: "00ab34cd56ef7890"}},
	}})
	if _, ok := c.DigestGroup(0x00ab34cd56ef7890); ok || c.CacheGeneration() == gen {
		t.Fatal("the DELETE left the digest bound or the generation as it was")
	}
	c.applySettings(&tokenpb.WatchResponse{Revision: 7, Events: []*tokenpb.WatchEvent{
		{Type: tokenpb.WatchEvent_DELETE, Binding: &tokenpb.Binding{Digest: "ffffffffffffffff"}},
	}})
	if c.cache.digestIdx.Load() != nil {
		t.Fatal("the index is kept with no digest bound: every statement would look it up")
	}
	if _, ok := c.Binding("app", "%"); !ok {
		t.Fatal("a digest's DELETE removed the account binding")
	}
}

// FuzzDecodeSnapshotDigests: a cache file's digest bindings come back
// keyed by their digest, valid and lower case, and never as another kind.
func FuzzDecodeSnapshotDigests(f *testing.F) {
	f.Add([]byte(`{"digests":{"00ab34cd56ef7890":{"Digest":"00AB34CD56EF7890","Group":"RG"}}}`))
	f.Add([]byte(`{"digests":{"x":{"Digest":"","Group":"g"}},"bindings":{"@":{"Digest":"00ab34cd56ef7890","Group":"g"}}}`))
	f.Add([]byte(`{"digests":{"k":{"User":"u","TagKey":"k","Digest":"ffffffffffffffff","Group":"g"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := decodeSnapshot(data)
		if err != nil {
			return
		}
		for key, b := range snap.Digests {
			if key != b.Digest || !b.IsDigest() || b.IsTag() || b.User != "" || resourcegroup.NormalizeDigest(key) != key || resourcegroup.ValidateDigest(key) != nil {
				t.Fatalf("digest key %q: %+v", key, b)
			}
		}
		for _, b := range snap.Bindings {
			if !b.IsAccount() {
				t.Fatalf("a digest or tag binding kept as an account's: %+v", b)
			}
		}
		newDigestIndex(snap.Digests)
	})
}

// BenchmarkDigestGroup is what every statement with a digest pays: with no
// digest bound (one atomic load), and with 10,000 bound (a map lookup).
func BenchmarkDigestGroup(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run(map[int]string{0: "none", 10000: "10000"}[n], func(b *testing.B) {
			c, _ := newTestClient(b, nil)
			defer c.Close()
			events := []*tokenpb.WatchEvent{{Group: &tokenpb.ResourceGroup{Name: "rg", RuPerSec: 10}}}
			for i := range n {
				events = append(events, &tokenpb.WatchEvent{Binding: &tokenpb.Binding{Digest: resourcegroup.FormatDigest(uint64(i) * 0x9e3779b97f4a7c15), Group: "rg"}})
			}
			c.applySettings(&tokenpb.WatchResponse{Revision: 1, Snapshot: true, Events: events})
			b.ResetTimer()
			found := 0
			for i := range b.N {
				if _, ok := c.DigestGroup(uint64(i&16383) * 0x9e3779b97f4a7c15); ok {
					found++
				}
			}
			if n > 0 && found == 0 {
				b.Fatal("no digest found")
			}
		})
	}
}
