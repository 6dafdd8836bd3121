package tokenserver

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The ResourceGroupService methods mirror resourcegroup.Store (and, in
// watches.go, resourcegroup.WatchStore) one to one; every replica serves
// them straight from etcd, within etcdCall's bounds.

// etcdCallTimeout bounds what one ResourceGroupService call waits for
// etcd: the etcd client waits for a connection as long as its context
// lets it, and DDL must fail with a clear error while etcd is away.
const etcdCallTimeout = 5 * time.Second

// etcdCall bounds ctx for one call's etcd requests, which also fail at
// once (WithRequireLeader) when the member knows it has no quorum.
func etcdCall(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
	return clientv3.WithRequireLeader(ctx), cancel
}

func needGroup(p *pb.ResourceGroup) error {
	if p == nil {
		return status.Error(codes.InvalidArgument, "missing group")
	}
	return nil
}

// CreateGroup implements tokenpb.ResourceGroupServiceServer.
func (s *Server) CreateGroup(ctx context.Context, req *pb.CreateGroupRequest) (*pb.CreateGroupResponse, error) {
	if err := needGroup(req.GetGroup()); err != nil {
		return nil, err
	}
	g := pb.GroupFromPB(req.GetGroup())
	// Judged before etcd's bounds start: a new leader may wait out its
	// capability window first.
	if err := s.checkKillRule(ctx, g, nil); err != nil {
		return nil, err
	}
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	g, err := s.store.createGroup(ctx, g)
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("resource group created", "group", g.Name, "version", g.Version)
	return &pb.CreateGroupResponse{Group: pb.GroupToPB(g)}, nil
}

// AlterGroup implements tokenpb.ResourceGroupServiceServer.
func (s *Server) AlterGroup(ctx context.Context, req *pb.AlterGroupRequest) (*pb.AlterGroupResponse, error) {
	if err := needGroup(req.GetGroup()); err != nil {
		return nil, err
	}
	g := pb.GroupFromPB(req.GetGroup())
	if hasKillRule(g) {
		// A KILL rule the group already had is not judged again.
		rctx, cancel := etcdCall(ctx)
		old, err := s.store.GetGroup(rctx, g.Name)
		cancel()
		var prev *resourcegroup.Group
		if err == nil {
			prev = &old
		}
		if err := s.checkKillRule(ctx, g, prev); err != nil {
			return nil, err
		}
	}
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	g, err := s.store.alterGroup(ctx, g)
	if err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("resource group altered", "group", g.Name, "version", g.Version)
	return &pb.AlterGroupResponse{Group: pb.GroupToPB(g)}, nil
}

// DropGroup implements tokenpb.ResourceGroupServiceServer.
func (s *Server) DropGroup(ctx context.Context, req *pb.DropGroupRequest) (*pb.DropGroupResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	if err := s.store.DropGroup(ctx, req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	s.log.Info("resource group dropped", "group", resourcegroup.NormalizeName(req.GetName()))
	return &pb.DropGroupResponse{}, nil
}

// GetGroup implements tokenpb.ResourceGroupServiceServer.
func (s *Server) GetGroup(ctx context.Context, req *pb.GetGroupRequest) (*pb.GetGroupResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	g, err := s.store.GetGroup(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.GetGroupResponse{Group: pb.GroupToPB(g)}, nil
}

// ListGroups implements tokenpb.ResourceGroupServiceServer.
func (s *Server) ListGroups(ctx context.Context, _ *pb.ListGroupsRequest) (*pb.ListGroupsResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	gs, rev, err := s.store.listGroups(ctx, 0)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.ListGroupsResponse{Revision: rev, Groups: make([]*pb.ResourceGroup, len(gs))}
	for i, g := range gs {
		out.Groups[i] = pb.GroupToPB(g)
	}
	return out, nil
}

// BindUser implements tokenpb.ResourceGroupServiceServer.
func (s *Server) BindUser(ctx context.Context, req *pb.BindUserRequest) (*pb.BindUserResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	if req.GetBinding() == nil {
		return nil, status.Error(codes.InvalidArgument, "missing binding")
	}
	if err := s.store.BindUser(ctx, pb.BindingFromPB(req.GetBinding())); err != nil {
		return nil, toStatus(err)
	}
	return &pb.BindUserResponse{}, nil
}

// UnbindUser implements tokenpb.ResourceGroupServiceServer.
func (s *Server) UnbindUser(ctx context.Context, req *pb.UnbindUserRequest) (*pb.UnbindUserResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	host := req.GetHost()
	if host == "" {
		host = "%"
	}
	if err := s.store.UnbindUser(ctx, req.GetUser(), host); err != nil {
		return nil, toStatus(err)
	}
	return &pb.UnbindUserResponse{}, nil
}

// GetBinding implements tokenpb.ResourceGroupServiceServer.
func (s *Server) GetBinding(ctx context.Context, req *pb.GetBindingRequest) (*pb.GetBindingResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	host := req.GetHost()
	if host == "" {
		host = "%"
	}
	b, err := s.store.GetBinding(ctx, req.GetUser(), host)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.GetBindingResponse{Binding: pb.BindingToPB(b)}, nil
}

// ListBindings implements tokenpb.ResourceGroupServiceServer.
func (s *Server) ListBindings(ctx context.Context, _ *pb.ListBindingsRequest) (*pb.ListBindingsResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	bs, rev, err := s.store.listBindings(ctx, 0)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.ListBindingsResponse{Revision: rev, Bindings: make([]*pb.Binding, len(bs))}
	for i, b := range bs {
		out.Bindings[i] = pb.BindingToPB(b)
	}
	return out, nil
}

// Watch implements tokenpb.ResourceGroupServiceServer: the settings stream
// ("Watch" is its wire name only), an optional snapshot, then every change
// to settings and bindings, each message carrying the etcd revision it
// brings the proxy to.
func (s *Server) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	ctx := stream.Context()
	// Each open settings stream costs an etcd watch: a proxy credential holds as
	// many as it is configured for proxies (plus one, for a reconnect).
	closeStream, err := s.proxies.open(principalFrom(ctx), kindSettings)
	if err != nil {
		return s.auth.refuse(refusedStreamLimit, codes.ResourceExhausted, err.Error())
	}
	defer closeStream()
	s.openStreams[kindSettings].Add(1)
	defer s.openStreams[kindSettings].Add(-1)
	after := req.GetAfterRevision()
	if after < 0 {
		return status.Errorf(codes.InvalidArgument, "after_revision %d is negative", after)
	}
	for {
		if after == 0 {
			rev, err := s.sendSnapshot(ctx, stream, req.GetSnapshotInParts())
			if err != nil {
				return err
			}
			after = rev
		}
		next, err := s.settingsFrom(ctx, stream, after)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		// next = 0: history compacted away, start over with a snapshot.
		after = next
	}
}

// snapshotPartBytes bounds one part of a snapshot sent in parts, well
// under gRPC's default 4 MiB per message.
const snapshotPartBytes = 1 << 20

// sendSnapshot sends every group, binding and live watch entry read at one
// revision: in one message, or in parts of at most snapshotPartBytes.
func (s *Server) sendSnapshot(ctx context.Context, stream grpc.ServerStreamingServer[pb.WatchResponse], inParts bool) (int64, error) {
	gs, rev, err := s.store.listGroups(ctx, 0)
	if err != nil {
		return 0, toStatus(err)
	}
	bs, _, err := s.store.listBindings(ctx, rev)
	if err != nil {
		return 0, toStatus(err)
	}
	ws, _, err := s.store.listWatches(ctx, rev)
	if err != nil {
		return 0, toStatus(err)
	}
	events := make([]*pb.WatchEvent, 0, len(gs)+len(bs)+len(ws))
	for _, g := range gs {
		events = append(events, &pb.WatchEvent{Type: pb.WatchEvent_PUT, Group: pb.GroupToPB(g)})
	}
	for _, b := range bs {
		events = append(events, &pb.WatchEvent{Type: pb.WatchEvent_PUT, Binding: pb.BindingToPB(b)})
	}
	for _, w := range ws {
		events = append(events, &pb.WatchEvent{Type: pb.WatchEvent_PUT, Watch: pb.WatchToPB(w)})
	}
	if !inParts {
		if err := stream.Send(&pb.WatchResponse{Revision: rev, Snapshot: true, Events: events}); err != nil {
			return 0, err
		}
		return rev, nil
	}
	for first := true; first || len(events) > 0; first = false {
		n, size := 0, 0
		for n < len(events) {
			es := proto.Size(events[n]) + 4 // with its tag and length
			if n > 0 && size+es > snapshotPartBytes {
				break
			}
			size += es
			n++
		}
		part := &pb.WatchResponse{Revision: rev, Snapshot: true, Events: events[:n], More: n < len(events)}
		if err := stream.Send(part); err != nil {
			return 0, err
		}
		events = events[n:]
	}
	return rev, nil
}

// settingsFrom streams changes after revision after. It returns the revision
// to resume from, 0 if the history was compacted (a snapshot is needed).
func (s *Server) settingsFrom(ctx context.Context, stream grpc.ServerStreamingServer[pb.WatchResponse], after int64) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.cli.Watch(wctx, keyRoot, clientv3.WithPrefix(), clientv3.WithRev(after+1)) {
		if wr.CompactRevision != 0 {
			return 0, nil
		}
		if err := wr.Err(); err != nil {
			return 0, status.Errorf(codes.Unavailable, "watch: %v", err)
		}
		resp := &pb.WatchResponse{Revision: wr.Header.Revision}
		for _, ev := range wr.Events {
			e, err := watchEvent(ev)
			if err != nil {
				s.log.Warn("skipping bad value in etcd", "key", string(ev.Kv.Key), "err", err)
				continue
			}
			if e != nil {
				resp.Events = append(resp.Events, e)
			}
		}
		after = wr.Header.Revision
		if len(resp.Events) == 0 {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return 0, err
		}
	}
	if ctx.Err() != nil {
		return after, nil
	}
	return 0, status.Error(codes.Unavailable, "watch closed by etcd")
}

// watchEvent converts an etcd event on a settings, account, tag, digest or watch key; nil
// for other keys (bucket states, the watch id counter).
func watchEvent(ev *clientv3.Event) (*pb.WatchEvent, error) {
	key := string(ev.Kv.Key)
	typ := pb.WatchEvent_PUT
	if ev.Type == clientv3.EventTypeDelete {
		typ = pb.WatchEvent_DELETE
	}
	switch {
	case strings.HasPrefix(key, keySettings):
		name := strings.TrimPrefix(key, keySettings)
		if typ == pb.WatchEvent_DELETE {
			return &pb.WatchEvent{Type: typ, Group: &pb.ResourceGroup{Name: name}}, nil
		}
		g, err := decodeGroup(name, ev.Kv.Value, ev.Kv.ModRevision)
		if err != nil {
			return nil, err
		}
		return &pb.WatchEvent{Type: typ, Group: pb.GroupToPB(g)}, nil
	case strings.HasPrefix(key, keyAccounts):
		account := strings.TrimPrefix(key, keyAccounts)
		if typ == pb.WatchEvent_DELETE {
			user, host := resourcegroup.SplitAccount(account)
			return &pb.WatchEvent{Type: typ, Binding: &pb.Binding{User: user, Host: host}}, nil
		}
		b, err := decodeBinding(account, ev.Kv.Value)
		if err != nil {
			return nil, err
		}
		return &pb.WatchEvent{Type: typ, Binding: pb.BindingToPB(b)}, nil
	case strings.HasPrefix(key, keyTags):
		tag := strings.TrimPrefix(key, keyTags)
		if typ == pb.WatchEvent_DELETE {
			k, v, err := resourcegroup.SplitTagBindingKey(tag)
			if err != nil {
				return nil, err
			}
			return &pb.WatchEvent{Type: typ, Binding: &pb.Binding{TagKey: k, TagValue: v}}, nil
		}
		b, err := decodeTagBinding(tag, ev.Kv.Value)
		if err != nil {
			return nil, err
		}
		return &pb.WatchEvent{Type: typ, Binding: pb.BindingToPB(b)}, nil
	case strings.HasPrefix(key, keyDigests):
		digest := strings.TrimPrefix(key, keyDigests)
		if typ == pb.WatchEvent_DELETE {
			if err := resourcegroup.ValidateDigest(digest); err != nil {
				return nil, err
			}
			return &pb.WatchEvent{Type: typ, Binding: &pb.Binding{Digest: resourcegroup.NormalizeDigest(digest)}}, nil
		}
		b, err := decodeDigestBinding(digest, ev.Kv.Value)
		if err != nil {
			return nil, err
		}
		return &pb.WatchEvent{Type: typ, Binding: pb.BindingToPB(b)}, nil
	case strings.HasPrefix(key, keyWatches):
		return watchEntryEvent(typ, ev.Kv.Value, key)
	}
	return nil, nil
}
