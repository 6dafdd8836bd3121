package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func exactWatch(group, text string) *pb.RunawayWatch {
	return &pb.RunawayWatch{Group: group, Match: pb.WatchType_WATCH_EXACT, Text: text, Source: resourcegroup.WatchSourceManual}
}

// createWatchGroups creates groups for watches to name.
func createWatchGroups(ctx context.Context, t *testing.T, c pb.ResourceGroupServiceClient, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: n, RuPerSec: 100}}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatchAddDedupeRemoveAcrossReplicas(t *testing.T) {
	cli := startEtcd(t)
	a := startServer(t, cli, "")
	b := startServer(t, cli, "")
	ca, cb := pb.NewResourceGroupServiceClient(a.conn), pb.NewResourceGroupServiceClient(b.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	createWatchGroups(ctx, t, ca, "rg1", "rg2")

	first, err := ca.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("RG1", "select sleep(5)")})
	if err != nil {
		t.Fatal(err)
	}
	w1 := first.GetWatch()
	if first.GetExisting() || w1.GetId() != 1 || w1.GetGroup() != "rg1" || w1.GetCreatedUnixMs() != t0.UnixMilli() || w1.GetExpiresUnixMs() != 0 {
		t.Fatalf("first add = %v", first)
	}
	// The same target through the other replica is the same entry.
	dup, err := cb.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("rg1", "select sleep(5)")})
	if err != nil || !dup.GetExisting() || dup.GetWatch().GetId() != 1 {
		t.Fatalf("duplicate add = %v, %v", dup, err)
	}
	// Same text, other match type or group: new entries.
	sim := exactWatch("rg1", "select sleep(5)")
	sim.Match = pb.WatchType_WATCH_SIMILAR
	if r, err := cb.AddWatch(ctx, &pb.AddWatchRequest{Watch: sim}); err != nil || r.GetExisting() || r.GetWatch().GetId() != 2 {
		t.Fatalf("similar add = %v, %v", r, err)
	}

	// Concurrent adds through both replicas get distinct ids.
	const n = 10
	ids := make([]uint64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ca
			if i%2 == 1 {
				c = cb
			}
			r, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("rg2", fmt.Sprintf("select %d", i))})
			ids[i], errs[i] = r.GetWatch().GetId(), err
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{1: true, 2: true}
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("concurrent add %d: %v", i, errs[i])
		}
		if seen[id] {
			t.Fatalf("id %d handed out twice: %v", id, ids)
		}
		seen[id] = true
	}
	list, err := cb.ListWatches(ctx, &pb.ListWatchesRequest{})
	if err != nil || len(list.GetWatches()) != n+2 {
		t.Fatalf("list = %v, %v", list, err)
	}
	for i, w := range list.GetWatches() {
		if w.GetId() != uint64(i+1) {
			t.Fatalf("list not sorted by id or ids not dense: %v", list.GetWatches())
		}
	}

	if _, err := cb.RemoveWatch(ctx, &pb.RemoveWatchRequest{Id: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = ca.RemoveWatch(ctx, &pb.RemoveWatchRequest{Id: 1})
	if codeOf(err) != codes.NotFound {
		t.Fatalf("second remove = %v, want NotFound", err)
	}
	var rgErr *resourcegroup.Error
	if back := pb.ErrorFromStatus(err); !errors.Is(back, resourcegroup.ErrWatchNotFound) || !errors.As(back, &rgErr) ||
		rgErr.Code != resourcegroup.CodeUnknown || !strings.Contains(rgErr.Message, "no runaway watch with the specific ID 1") {
		t.Fatalf("remove error maps back to %v", back)
	}
	// Removed, the target can be watched again, under a new id.
	again, err := ca.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("rg1", "select sleep(5)")})
	if err != nil || again.GetExisting() || again.GetWatch().GetId() != n+3 {
		t.Fatalf("re-add = %v, %v", again, err)
	}
	// The store interface agrees with the RPCs.
	ws, err := a.srv.Store().ListWatches(ctx)
	if err != nil || len(ws) != n+2 || ws[len(ws)-1].ID != n+3 {
		t.Fatalf("store list = %+v, %v", ws, err)
	}
}

func TestWatchExpiry(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	createWatchGroups(ctx, t, c, "rg1")

	w := exactWatch("rg1", "select 1")
	w.ExpiresUnixMs = t0.Add(90*time.Second + 300*time.Millisecond).UnixMilli()
	r, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: w})
	if err != nil {
		t.Fatal(err)
	}
	// The entry rides on a lease of the time left, rounded up.
	get, err := cli.Get(ctx, watchKey(r.GetWatch().GetId()))
	if err != nil || len(get.Kvs) != 1 || get.Kvs[0].Lease == 0 {
		t.Fatalf("stored entry = %v, %v", get, err)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(get.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 91 {
		t.Fatalf("lease = %+v, %v; want a granted TTL of 91 s", ttl, err)
	}
	// A watch without expiry has no lease.
	forever, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("rg1", "select 2")})
	if err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, watchKey(forever.GetWatch().GetId())); err != nil || get.Kvs[0].Lease != 0 {
		t.Fatalf("forever entry = %v, %v", get, err)
	}

	ts.clock.Advance(90 * time.Second)
	if l, _ := c.ListWatches(ctx, &pb.ListWatchesRequest{}); len(l.GetWatches()) != 2 {
		t.Fatalf("before expiry: %v", l)
	}
	ts.clock.Advance(300 * time.Millisecond)
	// Expired by the clock, even while etcd still holds the key.
	l, err := c.ListWatches(ctx, &pb.ListWatchesRequest{})
	if err != nil || len(l.GetWatches()) != 1 || l.GetWatches()[0].GetId() != forever.GetWatch().GetId() {
		t.Fatalf("after expiry: %v, %v", l, err)
	}
	// An expired entry does not deduplicate.
	w.ExpiresUnixMs = ts.clock.Now().Add(time.Minute).UnixMilli()
	r2, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: w})
	if err != nil || r2.GetExisting() || r2.GetWatch().GetId() == r.GetWatch().GetId() {
		t.Fatalf("re-add after expiry = %v, %v", r2, err)
	}
	// Removing a leased entry revokes its lease too.
	get, err = cli.Get(ctx, watchKey(r2.GetWatch().GetId()))
	if err != nil || len(get.Kvs) != 1 || get.Kvs[0].Lease == 0 {
		t.Fatalf("stored entry = %v, %v", get, err)
	}
	if _, err := c.RemoveWatch(ctx, &pb.RemoveWatchRequest{Id: r2.GetWatch().GetId()}); err != nil {
		t.Fatal(err)
	}
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(get.Kvs[0].Lease)); err != nil || ttl.TTL != -1 {
		t.Fatalf("lease after remove = %+v, %v; want revoked (TTL -1)", ttl, err)
	}
}

func TestWatchBadInputAndAuth(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "s3cret")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx := context.Background()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	createWatchGroups(admin, t, c, "rg1", "rg2")

	if _, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("rg1", "x")}); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("add without token: %v", err)
	}
	if _, err := c.RemoveWatch(ctx, &pb.RemoveWatchRequest{Id: 1}); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("remove without token: %v", err)
	}
	if _, err := c.ListWatches(ctx, &pb.ListWatchesRequest{}); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("list without a credential: %v", err)
	}
	proxy := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testProxyToken)
	if _, err := c.ListWatches(proxy, &pb.ListWatchesRequest{}); err != nil {
		t.Fatalf("list is a read, a proxy credential may: %v", err)
	}
	if _, err := c.AddWatch(proxy, &pb.AddWatchRequest{Watch: exactWatch("rg1", "x")}); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("add with a proxy credential: %v", err)
	}
	edit := func(f func(*pb.RunawayWatch)) *pb.RunawayWatch {
		w := exactWatch("rg1", "select 1")
		f(w)
		return w
	}
	tests := []struct {
		name string
		w    *pb.RunawayWatch
		want codes.Code
	}{
		{"missing", nil, codes.InvalidArgument},
		{"no group", edit(func(w *pb.RunawayWatch) { w.Group = "" }), codes.InvalidArgument},
		{"long group", edit(func(w *pb.RunawayWatch) { w.Group = strings.Repeat("g", 33) }), codes.InvalidArgument},
		{"no match", edit(func(w *pb.RunawayWatch) { w.Match = pb.WatchType_WATCH_NONE }), codes.InvalidArgument},
		{"no text", edit(func(w *pb.RunawayWatch) { w.Text = "" }), codes.InvalidArgument},
		{"bad action", edit(func(w *pb.RunawayWatch) { w.Action = 42 }), codes.InvalidArgument},
		{"switch to itself", edit(func(w *pb.RunawayWatch) {
			w.Action, w.SwitchGroup = pb.Action_ACTION_SWITCH_GROUP, "RG1"
		}), codes.InvalidArgument},
		{"already expired", edit(func(w *pb.RunawayWatch) { w.ExpiresUnixMs = t0.Add(-time.Second).UnixMilli() }), codes.InvalidArgument},
		{"unknown group", edit(func(w *pb.RunawayWatch) { w.Group = "nope" }), codes.NotFound},
		{"unknown switch target", edit(func(w *pb.RunawayWatch) {
			w.Action, w.SwitchGroup = pb.Action_ACTION_SWITCH_GROUP, "nope"
		}), codes.NotFound},
		{"default group", edit(func(w *pb.RunawayWatch) { w.Group = "DEFAULT" }), codes.OK},
		{"ok", edit(func(w *pb.RunawayWatch) {
			w.Action, w.SwitchGroup = pb.Action_ACTION_SWITCH_GROUP, "rg2"
		}), codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.AddWatch(admin, &pb.AddWatchRequest{Watch: tt.w})
			if codeOf(err) != tt.want {
				t.Fatalf("AddWatch(%v) = %v, want %v", tt.w, err, tt.want)
			}
			if tt.want == codes.InvalidArgument && tt.w != nil && !errors.Is(pb.ErrorFromStatus(err), resourcegroup.ErrInvalid) {
				t.Fatalf("error %v does not map back to ErrInvalid", err)
			}
			var rgErr *resourcegroup.Error
			if tt.want == codes.NotFound && (!errors.As(pb.ErrorFromStatus(err), &rgErr) || rgErr.Code != resourcegroup.CodeNotFound ||
				!strings.Contains(rgErr.Message, "'nope'")) {
				t.Fatalf("error %v does not map back to 8249 for 'nope'", err)
			}
		})
	}
	if _, err := c.RemoveWatch(admin, &pb.RemoveWatchRequest{Id: 0}); codeOf(err) != codes.NotFound {
		t.Fatalf("remove id 0: %v", err)
	}
}

func TestWatchStreamCarriesWatches(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	createWatchGroups(ctx, t, c, "rg1", "rg2")

	before, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: exactWatch("rg1", "select 1")})
	if err != nil {
		t.Fatal(err)
	}
	// An entry already expired by the server's clock is left out of the
	// snapshot.
	short := exactWatch("rg1", "select short")
	short.ExpiresUnixMs = t0.Add(time.Second).UnixMilli()
	if _, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: short}); err != nil {
		t.Fatal(err)
	}
	ts.clock.Advance(time.Second)

	stream, err := c.Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var snapWatches []*pb.RunawayWatch
	for _, e := range snap.GetEvents() {
		if e.GetWatch() != nil {
			snapWatches = append(snapWatches, e.GetWatch())
		}
	}
	if !snap.GetSnapshot() || len(snapWatches) != 1 || snapWatches[0].GetId() != before.GetWatch().GetId() ||
		snapWatches[0].GetText() != "select 1" {
		t.Fatalf("snapshot watches = %v", snapWatches)
	}

	w := exactWatch("rg2", "select 2")
	w.Action = pb.Action_ACTION_KILL
	w.ExpiresUnixMs = ts.clock.Now().Add(time.Hour).UnixMilli()
	added, err := c.AddWatch(ctx, &pb.AddWatchRequest{Watch: w})
	if err != nil {
		t.Fatal(err)
	}
	next := func() *pb.WatchEvent {
		t.Helper()
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetEvents()) != 1 {
			t.Fatalf("events = %v", r.GetEvents())
		}
		return r.GetEvents()[0]
	}
	if e := next(); e.GetType() != pb.WatchEvent_PUT || e.GetWatch().GetId() != added.GetWatch().GetId() ||
		e.GetWatch().GetAction() != pb.Action_ACTION_KILL || e.GetWatch().GetExpiresUnixMs() != w.ExpiresUnixMs {
		t.Fatalf("put event = %v", e)
	}
	if _, err := c.RemoveWatch(ctx, &pb.RemoveWatchRequest{Id: before.GetWatch().GetId()}); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.GetType() != pb.WatchEvent_DELETE || e.GetWatch().GetId() != before.GetWatch().GetId() {
		t.Fatalf("delete event = %v", e)
	}
	// etcd deleting the entry with its lease (what expiry does) reaches the
	// stream as a DELETE too; revoking stands in for the TTL running out.
	get, err := cli.Get(ctx, watchKey(added.GetWatch().GetId()))
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("stored = %v, %v", get, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(get.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.GetType() != pb.WatchEvent_DELETE || e.GetWatch().GetId() != added.GetWatch().GetId() {
		t.Fatalf("expiry event = %v", e)
	}
}

func TestDecodeWatchRejectsBadRecords(t *testing.T) {
	tests := []struct {
		key, val string
	}{
		{keyWatches + "abc", `{"group":"g","match":1,"text":"x"}`},
		{keyWatches + "0", `{"group":"g","match":1,"text":"x"}`},
		{keyWatches + "3", `{`},
	}
	for _, tt := range tests {
		if _, err := decodeWatch(tt.key, []byte(tt.val)); !errors.Is(err, ErrEtcd) {
			t.Errorf("decodeWatch(%q, %q) = %v, want ErrEtcd", tt.key, tt.val, err)
		}
	}
	w, err := decodeWatch(keyWatches+"12", []byte(`{"group":"g","match":2,"text":"d","created_unix_ms":5,"expires_unix_ms":9}`))
	if err != nil || w.ID != 12 || w.Match != resourcegroup.WatchSimilar || w.Created.UnixMilli() != 5 || w.Expires.UnixMilli() != 9 {
		t.Fatalf("decodeWatch = %+v, %v", w, err)
	}
}
