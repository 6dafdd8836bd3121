package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The runaway watch list: cached from the settings stream like groups and
// bindings, matched per statement without taking a lock, and
// written through rgserver's AddWatch / RemoveWatch.

// watchIndex is an immutable view of the watch list, rebuilt on every
// cache change (rare) so that MatchWatch (every statement) only reads.
type watchIndex struct {
	// exact by SQL text, similar by digest; each slice sorted by id.
	exact, similar map[string][]resourcegroup.Watch
}

func newWatchIndex(ws map[uint64]resourcegroup.Watch) *watchIndex {
	idx := &watchIndex{exact: map[string][]resourcegroup.Watch{}, similar: map[string][]resourcegroup.Watch{}}
	for _, w := range ws {
		switch w.Match {
		case resourcegroup.WatchExact:
			idx.exact[w.Text] = append(idx.exact[w.Text], w)
		case resourcegroup.WatchSimilar:
			idx.similar[w.Text] = append(idx.similar[w.Text], w)
		}
	}
	for _, m := range []map[string][]resourcegroup.Watch{idx.exact, idx.similar} {
		for _, l := range m {
			resourcegroup.SortWatches(l)
		}
	}
	return idx
}

// find returns the lowest-id live watch of group (any group when "")
// among candidates.
func find(candidates []resourcegroup.Watch, group string, now time.Time) (resourcegroup.Watch, bool) {
	for _, w := range candidates {
		if (group == "" || w.Group == group) && w.Live(now) {
			return w, true
		}
	}
	return resourcegroup.Watch{}, false
}

// normalizeWatch lower-cases the group names of a watch from the wire or
// the cache file.
func normalizeWatch(w resourcegroup.Watch) resourcegroup.Watch {
	w.Group = resourcegroup.NormalizeName(w.Group)
	if w.SwitchGroup != "" {
		w.SwitchGroup = resourcegroup.NormalizeName(w.SwitchGroup)
	}
	return w
}

// Watches returns the live runaway watches from the settings cache, sorted by
// id.
func (c *Client) Watches() []resourcegroup.Watch {
	now := c.clk.Now()
	var out []resourcegroup.Watch
	c.cache.read(func(snap *snapshot) {
		out = make([]resourcegroup.Watch, 0, len(snap.Watches))
		for _, w := range snap.Watches {
			if w.Live(now) {
				out = append(out, w)
			}
		}
	})
	resourcegroup.SortWatches(out)
	return out
}

// MatchWatch returns the live watch, of any group, that a statement
// matches: an EXACT watch whose text equals text, else a SIMILAR watch
// whose digest equals digest (computed by the caller: tokenclient parses
// no SQL). An empty text or digest matches nothing of its kind. When
// several match, the one with the lowest id wins. It takes no lock.
func (c *Client) MatchWatch(text, digest string) (resourcegroup.Watch, bool) {
	return c.MatchGroupWatch("", text, digest)
}

// MatchGroupWatch is MatchWatch restricted to the watches of group (as
// TiDB keeps a watch list per resource group); group "" means any.
func (c *Client) MatchGroupWatch(group, text, digest string) (resourcegroup.Watch, bool) {
	idx := c.cache.watchIdx.Load()
	if idx == nil {
		return resourcegroup.Watch{}, false
	}
	if group != "" {
		group = resourcegroup.NormalizeName(group)
	}
	now := c.clk.Now()
	if text != "" {
		if w, ok := find(idx.exact[text], group, now); ok {
			return w, true
		}
	}
	if digest != "" {
		if w, ok := find(idx.similar[digest], group, now); ok {
			return w, true
		}
	}
	return resourcegroup.Watch{}, false
}

// WatchStore returns the resourcegroup.WatchStore of QUERY WATCH and of
// runaway detection: the same value as Store, which implements both.
func (c *Client) WatchStore() resourcegroup.WatchStore { return rpcStore{c} }

var _ resourcegroup.WatchStore = rpcStore{}

// mapWatchError turns an AddWatch / RemoveWatch error into resourcegroup's:
// the server's *resourcegroup.Error when it sent one, ErrWatchNotFound for
// NotFound, else as mapError.
func mapWatchError(op string, id uint64, group string, err error) error {
	inner := err
	var f *rpcFailure
	if errors.As(err, &f) {
		inner = f.err
	}
	if back := tokenpb.ErrorFromStatus(inner); back != inner {
		return back
	}
	if status.Code(inner) == codes.NotFound {
		return resourcegroup.NewWatchNotFound(id)
	}
	return mapError(op, group, err)
}

// AddWatch adds w through rgserver (which assigns the id, or returns the
// live entry watching the same statements) and waits, at most 1 s, until
// the settings cache holds it, so MatchWatch on this proxy sees it at once.
func (s rpcStore) AddWatch(ctx context.Context, w resourcegroup.Watch) (resourcegroup.Watch, error) {
	w = normalizeWatch(w)
	var resp *tokenpb.AddWatchResponse
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) (err error) {
		resp, err = cl.AddWatch(ctx, &tokenpb.AddWatchRequest{Watch: tokenpb.WatchToPB(w)})
		return err
	})
	if err != nil {
		return resourcegroup.Watch{}, mapWatchError("add runaway watch", 0, w.Group, err)
	}
	got := normalizeWatch(tokenpb.WatchFromPB(resp.GetWatch()))
	if got.ID == 0 {
		return resourcegroup.Watch{}, fmt.Errorf("add runaway watch: rgserver returned no id")
	}
	s.c.waitCache(ctx, func(snap snapshot) bool { _, ok := snap.Watches[got.ID]; return ok })
	return got, nil
}

// RemoveWatch deletes watch id through rgserver and waits, at most 1 s,
// until the settings cache no longer holds it.
func (s rpcStore) RemoveWatch(ctx context.Context, id uint64) error {
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) error {
		_, err := cl.RemoveWatch(ctx, &tokenpb.RemoveWatchRequest{Id: id})
		return err
	})
	if err != nil {
		return mapWatchError("remove runaway watch", id, "", err)
	}
	s.c.waitCache(ctx, func(snap snapshot) bool { _, ok := snap.Watches[id]; return !ok })
	return nil
}

// ListWatches reads the settings cache: the live watches sorted by id.
func (s rpcStore) ListWatches(ctx context.Context) ([]resourcegroup.Watch, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list runaway watches: %w", err)
	}
	return s.c.Watches(), nil
}

// HasWatches reports whether any EXACT, and any SIMILAR, watch is cached,
// so that a caller computes a statement's digest only when it can match.
// It takes no lock.
func (c *Client) HasWatches() (exact, similar bool) {
	idx := c.cache.watchIdx.Load()
	if idx == nil {
		return false, false
	}
	return len(idx.exact) > 0, len(idx.similar) > 0
}
