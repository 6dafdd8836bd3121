package tokenserver

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Digest bindings live under /rg/digests/<digest> in lower case, are
// listed after the tag bindings, are bounded (replacing one takes no
// room) and removed by binding to default.
func TestEtcdStoreDigestBindings(t *testing.T) {
	cli := startEtcd(t)
	st := NewEtcdStore(cli)
	st.maxDigests = 2
	ctx := context.Background()
	if err := st.EnsureDefault(ctx); err != nil {
		t.Fatal(err)
	}
	dig := func(d, g string) resourcegroup.Binding { return resourcegroup.Binding{Digest: d, Group: g} }
	if err := st.BindUser(ctx, dig("00ab34cd56ef7890", "rg")); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Fatalf("bind a digest to a missing group: %v", err)
	}
	if err := st.BindUser(ctx, dig("00ab34cd56ef789", "default")); !errors.Is(err, resourcegroup.ErrInvalid) {
		t.Fatalf("a short digest: %v", err)
	}
	for _, g := range []string{"rg", "rg2"} {
		if err := st.CreateGroup(ctx, resourcegroup.Group{Name: g, RUPerSec: 10}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []resourcegroup.Binding{
		dig("00AB34CD56EF7890", "RG"),
		dig("1111111111111111", "rg"),
		dig("00ab34cd56ef7890", "rg2"), // replaces: no room needed
		{TagKey: "route", TagValue: "/r", Group: "rg"},
	} {
		if err := st.BindUser(ctx, b); err != nil {
			t.Fatalf("%+v: %v", b, err)
		}
	}
	err := st.BindUser(ctx, dig("2222222222222222", "rg"))
	if !errors.Is(err, resourcegroup.ErrInvalid) || !strings.Contains(err.Error(), "2 digests are bound already") {
		t.Fatalf("a third digest under a bound of 2: %v", err)
	}
	if resp, err := cli.Get(ctx, keyDigests+"00ab34cd56ef7890"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the binding is not under its lower-case key: %v %v", resp, err)
	}
	want := []resourcegroup.Binding{{TagKey: "route", TagValue: "/r", Group: "rg"}, dig("00ab34cd56ef7890", "rg2"), dig("1111111111111111", "rg")}
	if bs, err := st.ListBindings(ctx); err != nil || !reflect.DeepEqual(bs, want) {
		t.Fatalf("bindings:\n got  %+v, %v\n want %+v", bs, err, want)
	}
	if err := st.BindUser(ctx, dig("1111111111111111", "default")); err != nil {
		t.Fatal(err)
	}
	if err := st.BindUser(ctx, dig("2222222222222222", "rg")); err != nil {
		t.Fatalf("a digest once another was dropped: %v", err)
	}
	if bs, _ := st.ListBindings(ctx); !reflect.DeepEqual(bs, []resourcegroup.Binding{want[0], want[1], dig("2222222222222222", "rg")}) {
		t.Fatalf("after unbinding a digest: %+v", bs)
	}
}

// The settings stream carries digest bindings: in its snapshot, and as
// PUT and DELETE events (the DELETE rebuilt from the key).
func TestWatchCarriesDigestBindings(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 10}}); err != nil {
		t.Fatal(err)
	}
	bind := func(d, g string) {
		t.Helper()
		if _, err := c.BindUser(ctx, &pb.BindUserRequest{Binding: &pb.Binding{Digest: d, Group: g}}); err != nil {
			t.Fatal(err)
		}
	}
	bind("00ab34cd56ef7890", "a")
	w, err := c.Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ds []string
	for _, e := range snap.Events {
		if b := e.GetBinding(); b != nil {
			ds = append(ds, b.GetDigest()+">"+b.GetGroup()+" user="+b.GetUser())
		}
	}
	if !snap.Snapshot || !reflect.DeepEqual(ds, []string{"00ab34cd56ef7890>a user="}) {
		t.Fatalf("snapshot's bindings = %q", ds)
	}
	bind("FFFFFFFFFFFFFFFF", "a")
	bind("ffffffffffffffff", "default")
	var got []string
	for len(got) < 2 {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.Events {
			got = append(got, e.Type.String()+" "+e.GetBinding().GetDigest()+">"+e.GetBinding().GetGroup())
		}
	}
	if !reflect.DeepEqual(got, []string{"PUT ffffffffffffffff>a", "DELETE ffffffffffffffff>"}) {
		t.Fatalf("events = %q", got)
	}
	if _, err := c.BindUser(ctx, &pb.BindUserRequest{Binding: &pb.Binding{Digest: "00ab34cd56ef7890", Group: "nope"}}); codeOf(err) != codes.NotFound {
		t.Fatalf("bind a digest to a missing group: %v", err)
	}
	if _, err := c.BindUser(ctx, &pb.BindUserRequest{Binding: &pb.Binding{Digest: "zz", Group: "a"}}); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("bind a bad digest: %v", err)
	}
}
