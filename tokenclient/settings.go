package tokenclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// snapshot is the settings cache, and the JSON file kept under CacheDir.
type snapshot struct {
	// Revision is the etcd revision the cache is at.
	Revision int64 `json:"revision"`
	// Groups by name.
	Groups map[string]resourcegroup.Group `json:"groups"`
	// Bindings by account (resourcegroup.AccountKey).
	Bindings map[string]resourcegroup.Binding `json:"bindings"`
	// users counts the bindings of each user name, so that a session of a
	// user with none never asks the backend for its account.
	users map[string]int
	// Tags are the tag bindings by resourcegroup.TagBindingKey, apart
	// from the account bindings (an earlier version's file has none).
	Tags map[string]resourcegroup.Binding `json:"tags,omitempty"`
	// Digests are the digest bindings by digest (an earlier version's
	// file has none).
	Digests map[string]resourcegroup.Binding `json:"digests,omitempty"`
	// Watches is the runaway watch list by id, expired entries included
	// until rgserver deletes them (readers filter on Expires).
	Watches map[uint64]resourcegroup.Watch `json:"watches"`
}

func newSnapshot() snapshot {
	return snapshot{Groups: map[string]resourcegroup.Group{}, Bindings: map[string]resourcegroup.Binding{},
		Watches: map[uint64]resourcegroup.Watch{}, users: map[string]int{}, Tags: map[string]resourcegroup.Binding{},
		Digests: map[string]resourcegroup.Binding{}}
}

// shallow copies the maps, not the values: enough for a reader on another
// goroutine, since the cache's values are replaced, never changed in place.
func (s snapshot) shallow() snapshot {
	return snapshot{Revision: s.Revision, Groups: maps.Clone(s.Groups), Bindings: maps.Clone(s.Bindings),
		Watches: maps.Clone(s.Watches), users: maps.Clone(s.users), Tags: maps.Clone(s.Tags), Digests: maps.Clone(s.Digests)}
}

// Group returns a group's definition from the settings cache. `default` is
// always there (its built-in definition until rgserver sends one).
func (c *Client) Group(name string) (resourcegroup.Group, bool) {
	name = resourcegroup.NormalizeName(name)
	g, ok := c.cache.definition(name)
	return g.Clone(), ok
}

// CacheGeneration changes whenever the groups, bindings or tag bindings
// cached from rgserver change: a caller may keep what Group, Binding,
// HasBindings, HasTagBindings and TagGroup told it while the generation
// stays the same. It takes no lock.
func (c *Client) CacheGeneration() uint64 { return c.cache.gen.Load() }

// Binding returns the binding of the account user@host from the settings stream
// cache.
func (c *Client) Binding(user, host string) (resourcegroup.Binding, bool) {
	k := resourcegroup.AccountKey(user, host)
	var b resourcegroup.Binding
	var ok bool
	c.cache.read(func(s *snapshot) { b, ok = s.Bindings[k] })
	return b, ok
}

// HasBindings reports whether any account of the user name is bound.
func (c *Client) HasBindings(user string) bool {
	var n int
	c.cache.read(func(s *snapshot) { n = s.users[user] })
	return n > 0
}

// HasTagBindings reports whether any tag is bound: without one, a
// statement's SQLCommenter comment is not even parsed.
func (c *Client) HasTagBindings() bool {
	var n int
	c.cache.read(func(s *snapshot) { n = len(s.Tags) })
	return n > 0
}

// TagGroup returns the group the tag key='value' is bound to, from the
// settings cache. The group may no longer exist.
func (c *Client) TagGroup(key, value string) (string, bool) {
	k := resourcegroup.TagBindingKey(key, value)
	var b resourcegroup.Binding
	var ok bool
	c.cache.read(func(s *snapshot) { b, ok = s.Tags[k] })
	return b.Group, ok
}

// DigestGroup returns the group the statement shape of digest hash h
// (sqlscan.DigestHash, statements_summary's DIGEST) is bound to. While
// no digest is bound it costs one atomic load; otherwise one map lookup,
// without a lock. The group may no longer exist.
func (c *Client) DigestGroup(h uint64) (string, bool) {
	idx := c.cache.digestIdx.Load()
	if idx == nil {
		return "", false
	}
	g, ok := (*idx)[h]
	return g, ok
}

// HasDigestBindings reports whether any statement digest is bound.
func (c *Client) HasDigestBindings() bool { return c.cache.digestIdx.Load() != nil }

// putBinding and deleteBinding change snap's bindings and their count per
// user name together.
func (s *snapshot) putBinding(b resourcegroup.Binding) {
	k := b.Account()
	if _, ok := s.Bindings[k]; !ok {
		s.users[b.User]++
	}
	s.Bindings[k] = b
}

func (s *snapshot) deleteBinding(user, host string) {
	k := resourcegroup.AccountKey(user, host)
	if _, ok := s.Bindings[k]; ok {
		delete(s.Bindings, k)
		if s.users[user]--; s.users[user] <= 0 {
			delete(s.users, user)
		}
	}
}

// settingsLoop keeps a settings stream (rpc Watch) open to any server, resuming from the last
// revision. first receives nil at the first snapshot, or an error once every
// server failed before any snapshot came.
func (c *Client) settingsLoop(ctx context.Context, first chan<- error) {
	idx, attempt, failures := 0, 0, 0
	reported := false
	report := func(err error) {
		if !reported {
			reported = true
			first <- err
		}
	}
	for {
		addr := c.cfg.Servers[idx]
		got, err := c.runSettings(ctx, addr, func() { report(nil) })
		if ctx.Err() != nil {
			return
		}
		if got {
			attempt, failures = 0, 0
		} else {
			failures++
			if failures >= len(c.cfg.Servers) {
				report(err)
			}
		}
		idx = (idx + 1) % len(c.cfg.Servers)
		attempt++
		d := backoff(attempt)
		c.log.Warn("settings stream ended; reconnecting", "server", addr, "err", err, "backoff", d.String())
		if err := c.sleep(ctx, d); err != nil {
			return
		}
	}
}

// runSettings follows one settings stream until it fails; got tells whether any
// response arrived. loaded is called after the first applied response.
func (c *Client) runSettings(ctx context.Context, addr string, loaded func()) (got bool, err error) {
	cc, err := c.conn(addr)
	if err != nil {
		return false, err
	}
	after := c.cache.resumeAfter()
	// In parts: a snapshot of 100,000 groups would not fit in one message.
	stream, err := tokenpb.NewResourceGroupServiceClient(cc).Watch(ctx, &tokenpb.WatchRequest{AfterRevision: after, SnapshotInParts: true})
	if err != nil {
		return false, fmt.Errorf("settings stream from %s: %w", addr, err)
	}
	var parts *snapshot // a snapshot being received in parts
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("settings stream from %s: %w", addr, err)
		}
		if resp.GetSnapshot() && resp.GetMore() {
			if parts == nil {
				p := newSnapshot()
				parts = &p
			}
			applyEvents(parts, resp.GetEvents())
			continue
		}
		var changed bool
		if parts != nil && resp.GetSnapshot() {
			applyEvents(parts, resp.GetEvents())
			parts.Revision = resp.GetRevision()
			c.installSnapshot(*parts)
			parts, changed = nil, true
		} else {
			changed = c.applySettings(resp)
		}
		if !got {
			got = true
			loaded()
		}
		if changed {
			c.kickSave()
		}
	}
}

// applySettings applies one whole response of the settings stream (a
// snapshot in one message, or changes) to the cache, then brings the
// groups in use up to date, and reports whether it changed anything.
func (c *Client) applySettings(resp *tokenpb.WatchResponse) bool {
	if resp.GetSnapshot() {
		snap := newSnapshot()
		applyEvents(&snap, resp.GetEvents())
		snap.Revision = resp.GetRevision()
		c.installSnapshot(snap)
		return true
	}
	touched := c.cache.apply(resp)
	c.groups.mu.Lock()
	now := c.clk.Now()
	for _, name := range touched {
		if gs, ok := c.groups.byName[name]; ok {
			c.groups.refreshGroupLocked(now, gs)
		}
	}
	c.groups.droppedFromCacheLocked(touched)
	c.groups.mu.Unlock()
	c.cache.wake() // once the groups follow the change
	c.groups.notifyForgotten()
	return len(resp.GetEvents()) > 0
}

// applyEvents applies events to snap and returns the names of the groups
// they touched and whether any touched the runaway watch list or the
// digest bindings.
func applyEvents(snap *snapshot, events []*tokenpb.WatchEvent) (touched []string, watches, digests bool) {
	for _, ev := range events {
		del := ev.GetType() == tokenpb.WatchEvent_DELETE
		switch {
		case ev.GetGroup() != nil:
			name := resourcegroup.NormalizeName(ev.GetGroup().GetName())
			touched = append(touched, name)
			if del {
				delete(snap.Groups, name)
			} else {
				g := tokenpb.GroupFromPB(ev.GetGroup())
				g.Name = name
				snap.Groups[name] = g
			}
		case ev.GetBinding() != nil:
			b := tokenpb.BindingFromPB(ev.GetBinding())
			if b.IsDigest() {
				if resourcegroup.ValidateDigest(b.Digest) != nil {
					continue
				}
				digests = true
				d := resourcegroup.NormalizeDigest(b.Digest)
				if del {
					delete(snap.Digests, d)
				} else {
					snap.Digests[d] = resourcegroup.Binding{Digest: d, Group: resourcegroup.NormalizeName(b.Group)}
				}
				continue
			}
			if b.IsTag() {
				if del {
					delete(snap.Tags, b.Tag())
				} else {
					b.Group = resourcegroup.NormalizeName(b.Group)
					snap.Tags[b.Tag()] = b
				}
				continue
			}
			if b.Host == "" {
				b.Host = "%"
			}
			if del {
				snap.deleteBinding(b.User, b.Host)
			} else {
				b.Group = resourcegroup.NormalizeName(b.Group)
				snap.putBinding(b)
			}
		case ev.GetWatch() != nil:
			watches = true
			id := ev.GetWatch().GetId()
			if del {
				delete(snap.Watches, id)
			} else if id != 0 {
				snap.Watches[id] = normalizeWatch(tokenpb.WatchFromPB(ev.GetWatch()))
			}
		}
	}
	return touched, watches, digests
}

// installSnapshot replaces the cache with a whole snapshot from rgserver.
func (c *Client) installSnapshot(snap snapshot) {
	c.cache.install(snap, true)
	c.groups.mu.Lock()
	c.groups.cacheInstalledLocked()
	c.groups.mu.Unlock()
	c.cache.wake() // once the groups follow the change
	c.groups.notifyForgotten()
}

// cacheInstalledLocked brings every group in use up to date with a cache
// just installed whole: its unlimited mode, and dropped if it is gone.
func (t *groupTable) cacheInstalledLocked() {
	now := t.clk.Now()
	for _, gs := range t.byName {
		t.refreshGroupLocked(now, gs)
	}
	t.droppedFromCacheLocked(nil)
}

// refreshGroupLocked brings a group in use up to date with its definition
// in the cache: unlimited or not, and in degraded mode its local refill.
func (t *groupTable) refreshGroupLocked(now time.Time, gs *groupState) {
	g, ok := t.cache.group(gs.name)
	if !ok {
		return
	}
	switch unl := t.unlimitedLocked(g); {
	case unl && !gs.bucket.Unlimited():
		gs.bucket.SetUnlimited(true)
		gs.wake()
	case !unl && gs.bucket.Unlimited():
		gs.bucket.SetUnlimited(false)
		gs.want = true
		t.kickLocked()
	}
	if t.degraded || gs.unavailable {
		t.localRefillLocked(now, gs) // the new RU_PER_SEC applies at once
	}
}

// cacheSaveInterval spaces two writes of the snapshot file: with 100,000
// groups one is ~10 MB, and a burst of changes must not write it per change.
const cacheSaveInterval = time.Second

// kickSave asks saveLoop to write the snapshot file.
func (c *Client) kickSave() {
	select {
	case c.saveKick <- struct{}{}:
	default:
	}
}

// saveLoop writes the snapshot file when the cache changed, at most once
// per cacheSaveInterval, until ctx ends (then once more if a change is
// still unsaved).
func (c *Client) saveLoop(ctx context.Context) {
	save := func() {
		snap := c.cache.shallow()
		if err := c.saveCache(snap); err != nil {
			c.log.Warn("cannot save the groups snapshot", "err", err)
		}
	}
	last := func() {
		select {
		case <-c.saveKick:
			save()
		default:
		}
	}
	for {
		select {
		case <-ctx.Done():
			last()
			return
		case <-c.saveKick:
		}
		save()
		t := time.NewTimer(cacheSaveInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			last()
			return
		case <-t.C:
		}
	}
}

// saveCache writes snap to CacheDir atomically (temporary file, rename).
func (c *Client) saveCache(snap snapshot) error {
	if c.cfg.CacheDir == "" {
		return nil
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("tokenclient: encode snapshot: %w", err)
	}
	if err := os.MkdirAll(c.cfg.CacheDir, 0o755); err != nil {
		return fmt.Errorf("tokenclient: cache dir: %w", err)
	}
	tmp, err := os.CreateTemp(c.cfg.CacheDir, cacheFile+".*.tmp")
	if err != nil {
		return fmt.Errorf("tokenclient: write snapshot: %w", err)
	}
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("tokenclient: write snapshot: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(c.cfg.CacheDir, cacheFile)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("tokenclient: write snapshot: %w", err)
	}
	return nil
}

// loadCache reads the snapshot kept under CacheDir.
func (c *Client) loadCache() (snapshot, error) {
	if c.cfg.CacheDir == "" {
		return snapshot{}, errors.New("no cache dir configured")
	}
	data, err := os.ReadFile(filepath.Join(c.cfg.CacheDir, cacheFile))
	if err != nil {
		return snapshot{}, fmt.Errorf("read snapshot: %w", err)
	}
	return decodeSnapshot(data)
}

// decodeSnapshot parses a snapshot file; names are normalized.
func decodeSnapshot(data []byte) (snapshot, error) {
	var raw snapshot
	if err := json.Unmarshal(data, &raw); err != nil {
		return snapshot{}, fmt.Errorf("decode snapshot: %w", err)
	}
	snap := newSnapshot()
	snap.Revision = raw.Revision
	for _, g := range raw.Groups {
		g.Name = resourcegroup.NormalizeName(g.Name)
		if g.Name == "" {
			continue
		}
		snap.Groups[g.Name] = g.Clone()
	}
	for _, b := range raw.Tags {
		if resourcegroup.ValidateTag(b.TagKey, b.TagValue) != nil {
			continue
		}
		b.User, b.Host = "", ""
		b.Group = resourcegroup.NormalizeName(b.Group)
		snap.Tags[b.Tag()] = b
	}
	for _, b := range raw.Digests {
		if resourcegroup.ValidateDigest(b.Digest) != nil {
			continue
		}
		d := resourcegroup.NormalizeDigest(b.Digest)
		snap.Digests[d] = resourcegroup.Binding{Digest: d, Group: resourcegroup.NormalizeName(b.Group)}
	}
	for _, b := range raw.Bindings {
		if b.User == "" || !b.IsAccount() {
			continue
		}
		if b.Host == "" {
			b.Host = "%"
		}
		// A file of an earlier version is keyed by user name: the record
		// holds the host its ALTER USER named, which makes the account.
		b.Group = resourcegroup.NormalizeName(b.Group)
		snap.putBinding(b)
	}
	for _, w := range raw.Watches {
		if w.ID == 0 {
			continue
		}
		snap.Watches[w.ID] = normalizeWatch(w)
	}
	return snap, nil
}
