package tokenserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The runaway watch list lives under /rg/watches/<id>, ids from the counter
// /rg/watch-seq. An entry with an expiry is attached to its own etcd lease
// whose TTL is the time left, rounded up to whole seconds: etcd deletes the
// key by itself (every watcher sees a DELETE) on whichever replica is
// leader, with no sweeper of ours to elect or fence. A lease may outlive
// its entry by up to a second or two (TTL rounding, etcd's minimum TTL,
// lease renewal on an etcd leader change), so readers also filter on
// Expires with their own clock: the lease is garbage collection, Expires is
// the truth.
const (
	keyWatches  = "/rg/watches/"
	keyWatchSeq = "/rg/watch-seq"
)

func watchKey(id uint64) string { return keyWatches + strconv.FormatUint(id, 10) }

// watchRecord is a watch entry as stored in etcd (JSON); the id is the key.
type watchRecord struct {
	Group         string `json:"group"`
	Action        uint8  `json:"action,omitempty"`
	SwitchGroup   string `json:"switch_group,omitempty"`
	Match         uint8  `json:"match"`
	Text          string `json:"text"`
	Source        string `json:"source,omitempty"`
	CreatedUnixMs int64  `json:"created_unix_ms"`
	ExpiresUnixMs int64  `json:"expires_unix_ms,omitempty"`
}

func encodeWatch(w resourcegroup.Watch) ([]byte, error) {
	r := watchRecord{Group: w.Group, Action: uint8(w.Action), SwitchGroup: w.SwitchGroup,
		Match: uint8(w.Match), Text: w.Text, Source: w.Source, CreatedUnixMs: w.Created.UnixMilli()}
	if !w.Expires.IsZero() {
		r.ExpiresUnixMs = w.Expires.UnixMilli()
	}
	return json.Marshal(r)
}

func decodeWatch(key string, data []byte) (resourcegroup.Watch, error) {
	id, err := strconv.ParseUint(strings.TrimPrefix(key, keyWatches), 10, 64)
	if err != nil || id == 0 {
		return resourcegroup.Watch{}, fmt.Errorf("%w: watch key %q: bad id", ErrEtcd, key)
	}
	var r watchRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return resourcegroup.Watch{}, fmt.Errorf("%w: watch %d: bad stored value: %w", ErrEtcd, id, err)
	}
	w := resourcegroup.Watch{ID: id, Group: r.Group, Action: resourcegroup.Action(r.Action),
		SwitchGroup: r.SwitchGroup, Match: resourcegroup.WatchType(r.Match), Text: r.Text, Source: r.Source,
		Created: time.UnixMilli(r.CreatedUnixMs)}
	if r.ExpiresUnixMs != 0 {
		w.Expires = time.UnixMilli(r.ExpiresUnixMs)
	}
	return w, nil
}

var _ resourcegroup.WatchStore = (*EtcdStore)(nil)

// clock returns the store's time source.
func (s *EtcdStore) clock() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// AddWatch implements resourcegroup.WatchStore.
func (s *EtcdStore) AddWatch(ctx context.Context, w resourcegroup.Watch) (resourcegroup.Watch, error) {
	w, _, err := s.addWatch(ctx, w)
	return w, err
}

// addWatch also reports whether the returned watch already existed. The
// duplicate check, the id and the write are one transaction: it only
// commits if no watch key and not the counter changed since they were read,
// so two replicas never hand out one id or add the same watch twice.
func (s *EtcdStore) addWatch(ctx context.Context, w resourcegroup.Watch) (resourcegroup.Watch, bool, error) {
	w.Group = resourcegroup.NormalizeName(w.Group)
	if w.SwitchGroup != "" {
		w.SwitchGroup = resourcegroup.NormalizeName(w.SwitchGroup)
	}
	w.ID = 0
	now := s.clock()
	if w.Created.IsZero() {
		w.Created = now
	}
	// Stored in milliseconds: return exactly what readers will see.
	w.Created = time.UnixMilli(w.Created.UnixMilli())
	if !w.Expires.IsZero() {
		w.Expires = time.UnixMilli(w.Expires.UnixMilli())
	}
	if err := w.Validate(); err != nil {
		return w, false, err
	}
	if !w.Live(now) {
		return w, false, resourcegroup.NewInvalid("invalid runaway watch: it has already expired")
	}
	for {
		resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(keyWatches, clientv3.WithPrefix()), clientv3.OpGet(keyWatchSeq)).Commit()
		if err != nil {
			return w, false, fmt.Errorf("%w: add watch: %w", ErrEtcd, err)
		}
		rev := resp.Header.Revision
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			old, err := decodeWatch(string(kv.Key), kv.Value)
			if err != nil {
				return w, false, err
			}
			if old.Live(now) && old.SameTarget(w) {
				return old, true, nil
			}
		}
		var seq uint64
		var seqRev int64
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			seqRev = kvs[0].ModRevision
			if seq, err = strconv.ParseUint(string(kvs[0].Value), 10, 64); err != nil {
				return w, false, fmt.Errorf("%w: %s holds %q: %w", ErrEtcd, keyWatchSeq, kvs[0].Value, err)
			}
		}
		w.ID = seq + 1
		val, err := encodeWatch(w)
		if err != nil {
			return w, false, err
		}
		var opts []clientv3.OpOption
		var lease clientv3.LeaseID
		if !w.Expires.IsZero() {
			ttl := int64((w.Expires.Sub(now) + time.Second - 1) / time.Second)
			g, err := s.cli.Grant(ctx, max(ttl, 1))
			if err != nil {
				return w, false, fmt.Errorf("%w: add watch: lease: %w", ErrEtcd, err)
			}
			lease = g.ID
			opts = append(opts, clientv3.WithLease(lease))
		}
		conds := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(keyWatches), "<", rev+1).WithPrefix(),
			clientv3.Compare(clientv3.ModRevision(keyWatchSeq), "=", seqRev),
		}
		// The groups named must exist when the entry is written; on
		// failure the Else reads tell a missing group from a race.
		groups := watchGroups(w)
		var reads []clientv3.Op
		for _, g := range groups {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(settingsKey(g)), ">", 0))
			reads = append(reads, clientv3.OpGet(settingsKey(g), clientv3.WithCountOnly()))
		}
		tresp, err := s.cli.Txn(ctx).If(conds...).Then(
			clientv3.OpPut(keyWatchSeq, strconv.FormatUint(w.ID, 10)),
			clientv3.OpPut(watchKey(w.ID), string(val), opts...),
		).Else(reads...).Commit()
		if err == nil && tresp.Succeeded {
			return w, false, nil
		}
		if lease != 0 {
			s.revoke(lease)
		}
		if err != nil {
			return w, false, fmt.Errorf("%w: add watch: %w", ErrEtcd, err)
		}
		for i, r := range tresp.Responses {
			if r.GetResponseRange().GetCount() == 0 {
				return w, false, resourcegroup.NewNotFound(groups[i])
			}
		}
		// Another writer got in between: read again.
	}
}

// watchGroups lists the stored groups a watch names: its group and its
// SWITCH_GROUP target, except `default`, which always exists.
func watchGroups(w resourcegroup.Watch) []string {
	var out []string
	for _, g := range []string{w.Group, w.SwitchGroup} {
		if g != "" && g != resourcegroup.DefaultGroup {
			out = append(out, g)
		}
	}
	return out
}

// revoke drops a lease that no entry uses, best effort: an unused lease
// only costs etcd memory until its TTL ends.
func (s *EtcdStore) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, id)
}

// RemoveWatch implements resourcegroup.WatchStore.
func (s *EtcdStore) RemoveWatch(ctx context.Context, id uint64) error {
	if id == 0 {
		return resourcegroup.NewWatchNotFound(id)
	}
	resp, err := s.cli.Delete(ctx, watchKey(id), clientv3.WithPrevKV())
	if err != nil {
		return fmt.Errorf("%w: remove watch %d: %w", ErrEtcd, id, err)
	}
	if resp.Deleted == 0 {
		return resourcegroup.NewWatchNotFound(id)
	}
	if kv := resp.PrevKvs; len(kv) > 0 && kv[0].Lease != 0 {
		s.revoke(clientv3.LeaseID(kv[0].Lease))
	}
	return nil
}

// ListWatches implements resourcegroup.WatchStore.
func (s *EtcdStore) ListWatches(ctx context.Context) ([]resourcegroup.Watch, error) {
	ws, _, err := s.listWatches(ctx, 0)
	return ws, err
}

// listWatches reads the live watches at revision rev (0 = latest).
func (s *EtcdStore) listWatches(ctx context.Context, rev int64) ([]resourcegroup.Watch, int64, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cli.Get(ctx, keyWatches, opts...)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: list watches: %w", ErrEtcd, err)
	}
	now := s.clock()
	out := make([]resourcegroup.Watch, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		w, err := decodeWatch(string(kv.Key), kv.Value)
		if err != nil {
			return nil, 0, err
		}
		if w.Live(now) {
			out = append(out, w)
		}
	}
	resourcegroup.SortWatches(out)
	return out, resp.Header.Revision, nil
}

// watchEntryEvent converts an etcd event on a watch key.
func watchEntryEvent(typ pb.WatchEvent_Type, kv []byte, key string) (*pb.WatchEvent, error) {
	if typ == pb.WatchEvent_DELETE {
		id, err := strconv.ParseUint(strings.TrimPrefix(key, keyWatches), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: watch key %q: bad id", ErrEtcd, key)
		}
		return &pb.WatchEvent{Type: typ, Watch: &pb.RunawayWatch{Id: id}}, nil
	}
	w, err := decodeWatch(key, kv)
	if err != nil {
		return nil, err
	}
	return &pb.WatchEvent{Type: typ, Watch: pb.WatchToPB(w)}, nil
}

// AddWatch implements tokenpb.ResourceGroupServiceServer.
func (s *Server) AddWatch(ctx context.Context, req *pb.AddWatchRequest) (*pb.AddWatchResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	if req.GetWatch() == nil {
		return nil, status.Error(codes.InvalidArgument, "missing watch")
	}
	w, existing, err := s.store.addWatch(ctx, pb.WatchFromPB(req.GetWatch()))
	if err != nil {
		return nil, toStatus(err)
	}
	if !existing {
		s.log.Info("runaway watch added", "id", w.ID, "group", w.Group, "match", w.Match.String(),
			"source", w.Source, "expires", w.Expires)
	}
	return &pb.AddWatchResponse{Watch: pb.WatchToPB(w), Existing: existing}, nil
}

// RemoveWatch implements tokenpb.ResourceGroupServiceServer.
func (s *Server) RemoveWatch(ctx context.Context, req *pb.RemoveWatchRequest) (*pb.RemoveWatchResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	if err := s.store.RemoveWatch(ctx, req.GetId()); err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("runaway watch removed", "id", req.GetId())
	return &pb.RemoveWatchResponse{}, nil
}

// ListWatches implements tokenpb.ResourceGroupServiceServer.
func (s *Server) ListWatches(ctx context.Context, _ *pb.ListWatchesRequest) (*pb.ListWatchesResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	ws, rev, err := s.store.listWatches(ctx, 0)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.ListWatchesResponse{Revision: rev, Watches: make([]*pb.RunawayWatch, len(ws))}
	for i, w := range ws {
		out.Watches[i] = pb.WatchToPB(w)
	}
	return out, nil
}
