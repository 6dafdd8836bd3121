package tokenclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// snapshot is the Watch cache, and the JSON file kept under CacheDir.
type snapshot struct {
	// Revision is the etcd revision the cache is at.
	Revision int64 `json:"revision"`
	// Groups by name.
	Groups map[string]resourcegroup.Group `json:"groups"`
	// Bindings by user.
	Bindings map[string]resourcegroup.Binding `json:"bindings"`
	// Watches is the runaway watch list by id, expired entries included
	// until rgserver deletes them (readers filter on Expires).
	Watches map[uint64]resourcegroup.Watch `json:"watches"`
}

func newSnapshot() snapshot {
	return snapshot{Groups: map[string]resourcegroup.Group{}, Bindings: map[string]resourcegroup.Binding{},
		Watches: map[uint64]resourcegroup.Watch{}}
}

func (s snapshot) clone() snapshot {
	out := snapshot{Revision: s.Revision,
		Groups:   make(map[string]resourcegroup.Group, len(s.Groups)),
		Bindings: make(map[string]resourcegroup.Binding, len(s.Bindings)),
		Watches:  make(map[uint64]resourcegroup.Watch, len(s.Watches))}
	for k, w := range s.Watches {
		out.Watches[k] = w
	}
	for k, g := range s.Groups {
		out.Groups[k] = g.Clone()
	}
	for k, b := range s.Bindings {
		out.Bindings[k] = b
	}
	return out
}

// Group returns a group's definition from the Watch cache. `default` is
// always there (its built-in definition until rgserver sends one).
func (c *Client) Group(name string) (resourcegroup.Group, bool) {
	name = resourcegroup.NormalizeName(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.settingsLocked(name)
	return g.Clone(), ok
}

// Binding returns a user's binding from the Watch cache.
func (c *Client) Binding(user string) (resourcegroup.Binding, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.cache.Bindings[user]
	return b, ok
}

// watchLoop keeps a Watch stream open to any server, resuming from the last
// revision. first receives nil at the first snapshot, or an error once every
// server failed before any snapshot came.
func (c *Client) watchLoop(ctx context.Context, first chan<- error) {
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
		got, err := c.runWatch(ctx, addr, func() { report(nil) })
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
		c.log.Warn("watch stream ended; reconnecting", "server", addr, "err", err, "backoff", d.String())
		if err := c.sleep(ctx, d); err != nil {
			return
		}
	}
}

// runWatch follows one Watch stream until it fails; got tells whether any
// response arrived. loaded is called after the first applied response.
func (c *Client) runWatch(ctx context.Context, addr string, loaded func()) (got bool, err error) {
	cc, err := c.conn(addr)
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	after := c.cache.Revision
	if !c.watchSynced {
		after = 0 // a cached file's revision may be from another etcd
	}
	c.mu.Unlock()
	stream, err := tokenpb.NewResourceGroupServiceClient(cc).Watch(ctx, &tokenpb.WatchRequest{AfterRevision: after})
	if err != nil {
		return false, fmt.Errorf("watch %s: %w", addr, err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("watch %s: %w", addr, err)
		}
		snap, changed := c.applyWatch(resp)
		if !got {
			got = true
			loaded()
		}
		if changed {
			if err := c.saveCache(snap); err != nil {
				c.log.Warn("cannot save the groups snapshot", "err", err)
			}
		}
	}
}

// applyWatch applies one WatchResponse to the cache and returns a copy of
// the new cache, and whether it is worth saving (it has events or is a
// snapshot).
func (c *Client) applyWatch(resp *tokenpb.WatchResponse) (snapshot, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next snapshot
	if resp.GetSnapshot() {
		next = newSnapshot()
	} else {
		next = c.cache.clone()
	}
	for _, ev := range resp.GetEvents() {
		del := ev.GetType() == tokenpb.WatchEvent_DELETE
		switch {
		case ev.GetGroup() != nil:
			name := resourcegroup.NormalizeName(ev.GetGroup().GetName())
			if del {
				delete(next.Groups, name)
			} else {
				g := tokenpb.GroupFromPB(ev.GetGroup())
				g.Name = name
				next.Groups[name] = g
			}
		case ev.GetBinding() != nil:
			user := ev.GetBinding().GetUser()
			if del {
				delete(next.Bindings, user)
			} else {
				b := tokenpb.BindingFromPB(ev.GetBinding())
				b.Group = resourcegroup.NormalizeName(b.Group)
				next.Bindings[user] = b
			}
		case ev.GetWatch() != nil:
			id := ev.GetWatch().GetId()
			if del {
				delete(next.Watches, id)
			} else if id != 0 {
				next.Watches[id] = normalizeWatch(tokenpb.WatchFromPB(ev.GetWatch()))
			}
		}
	}
	next.Revision = resp.GetRevision()
	c.watchSynced = true
	c.setCacheLocked(next)
	return next.clone(), resp.GetSnapshot() || len(resp.GetEvents()) > 0
}

// setCacheLocked installs snap as the cache, updates the groups' unlimited
// mode and wakes read-your-writes waiters.
func (c *Client) setCacheLocked(snap snapshot) {
	c.cache = snap
	c.cacheLoaded = true
	c.watchIdx.Store(newWatchIndex(snap.Watches))
	now := c.clk.Now()
	for name, gs := range c.groups {
		g, ok := snap.Groups[name]
		if !ok {
			continue
		}
		switch unl := isUnlimited(g); {
		case unl && !gs.bucket.Unlimited():
			gs.bucket.SetUnlimited(true)
			gs.wake()
		case !unl && gs.bucket.Unlimited():
			gs.bucket.SetUnlimited(false)
			gs.want = true
			c.kickLocked()
		}
		if c.degraded {
			c.localRefillLocked(now, gs) // the new RU_PER_SEC applies at once
		}
	}
	close(c.cacheChanged)
	c.cacheChanged = make(chan struct{})
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
	for _, b := range raw.Bindings {
		if b.User == "" {
			continue
		}
		b.Group = resourcegroup.NormalizeName(b.Group)
		snap.Bindings[b.User] = b
	}
	for _, w := range raw.Watches {
		if w.ID == 0 {
			continue
		}
		snap.Watches[w.ID] = normalizeWatch(w)
	}
	return snap, nil
}
