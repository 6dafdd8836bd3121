package tokenclient

import (
	"sync"
	"sync/atomic"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// settingsCache is the cache of groups, bindings, tag bindings and runaway
// watches that the settings stream keeps (settings.go), with its own
// lock. The settings stream's goroutine is its only writer (and Start,
// from the snapshot file, while no stream answered); sessions, the
// groups' state and the console read it. Lock order: groupTable.mu, then
// settingsCache.mu (read: a group's definition), never the other way
// round: the writer releases this lock before it tells the groups what
// changed.
type settingsCache struct {
	mu   sync.RWMutex
	snap snapshot
	// loaded: it holds a snapshot, from the stream or the file; synced:
	// from the stream, whose revision a resume may start after.
	loaded, synced bool
	// changed is closed and replaced on every change (read-your-writes
	// waits, store.go).
	changed chan struct{}
	// gen counts the changes (CacheGeneration); read without the lock.
	gen atomic.Uint64
	// watchIdx is the runaway watch list indexed for MatchWatch, replaced
	// with the list so that matching takes no lock.
	watchIdx atomic.Pointer[watchIndex]
	// digestIdx is the digest bindings by digest hash, the group each
	// names; nil while none is bound, so that a statement's lookup is
	// one atomic load then. Replaced whole when they change.
	digestIdx atomic.Pointer[map[uint64]string]
}

func newSettingsCache() *settingsCache {
	return &settingsCache{snap: newSnapshot(), changed: make(chan struct{})}
}

// group returns the cached definition of group name.
func (sc *settingsCache) group(name string) (resourcegroup.Group, bool) {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	g, ok := sc.snap.Groups[name]
	return g, ok
}

// read runs f on the cache under its read lock; f must not keep snap's
// maps nor take another lock.
func (sc *settingsCache) read(f func(snap *snapshot)) {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	f(&sc.snap)
}

// resumeAfter is the revision a new settings stream starts after: 0 (a
// snapshot) unless the cache came from a stream (a file's revision may be
// from another etcd).
func (sc *settingsCache) resumeAfter() int64 {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	if !sc.synced {
		return 0
	}
	return sc.snap.Revision
}

// apply applies one response of changes in place, so that each costs in
// proportion to its events, not to the groups held, and returns the
// groups they touched.
func (sc *settingsCache) apply(resp *tokenpb.WatchResponse) (touched []string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	touched, watches, digests := applyEvents(&sc.snap, resp.GetEvents())
	sc.snap.Revision = resp.GetRevision()
	if digests {
		sc.digestIdx.Store(newDigestIndex(sc.snap.Digests))
	}
	if len(resp.GetEvents()) > 0 {
		sc.gen.Add(1)
	}
	sc.synced, sc.loaded = true, true
	if watches {
		sc.watchIdx.Store(newWatchIndex(sc.snap.Watches))
	}
	return touched
}

// install replaces the cache with snap: from the stream when synced,
// else from the file, which never replaces a cache already loaded;
// false when it did not install snap.
func (sc *settingsCache) install(snap snapshot, synced bool) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !synced && sc.loaded {
		return false // the stream answered meanwhile
	}
	sc.snap = snap
	sc.gen.Add(1)
	sc.loaded = true
	sc.synced = sc.synced || synced
	sc.watchIdx.Store(newWatchIndex(snap.Watches))
	sc.digestIdx.Store(newDigestIndex(snap.Digests))
	return true
}

// newDigestIndex indexes digest bindings by the hash their digest
// stands for; nil when there are none.
func newDigestIndex(bs map[string]resourcegroup.Binding) *map[uint64]string {
	if len(bs) == 0 {
		return nil
	}
	idx := make(map[uint64]string, len(bs))
	for _, b := range bs {
		if h, err := resourcegroup.ParseDigest(b.Digest); err == nil {
			idx[h] = b.Group
		}
	}
	return &idx
}

// wake wakes whoever waits for the cache to change.
func (sc *settingsCache) wake() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	close(sc.changed)
	sc.changed = make(chan struct{})
}

// check reports whether ok holds on the cache, and the channel closed at
// its next change.
func (sc *settingsCache) check(ok func(snapshot) bool) (bool, <-chan struct{}) {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return ok(sc.snap), sc.changed
}

// shallow returns a shallow copy of the snapshot to save.
func (sc *settingsCache) shallow() snapshot {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return sc.snap.shallow()
}

// revision is the etcd revision the cache is at (from the stream or the
// file).
func (sc *settingsCache) revision() int64 {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return sc.snap.Revision
}

// definition returns a group's definition from the cache; `default`
// has its built-in one until rgserver sends one.
func (sc *settingsCache) definition(name string) (resourcegroup.Group, bool) {
	if g, ok := sc.group(name); ok {
		return g, true
	}
	if name == resourcegroup.DefaultGroup {
		return resourcegroup.DefaultGroupDefinition(), true
	}
	return resourcegroup.Group{}, false
}
