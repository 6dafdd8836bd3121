package tokenserver

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Tag bindings live under /rg/tags/<key>=<value>, both parts escaped, so
// that any key and value round-trip, and are listed with the account
// bindings.
func TestEtcdStoreTagBindings(t *testing.T) {
	cli := startEtcd(t)
	st := NewEtcdStore(cli)
	ctx := context.Background()
	if err := st.EnsureDefault(ctx); err != nil {
		t.Fatal(err)
	}
	tag := func(k, v, g string) resourcegroup.Binding {
		return resourcegroup.Binding{TagKey: k, TagValue: v, Group: g}
	}
	if err := st.BindUser(ctx, tag("route", "/report", "rg")); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Fatalf("bind a tag to a missing group: %v", err)
	}
	if err := st.BindUser(ctx, tag("k", string([]byte{0xff}), "rg")); !errors.Is(err, resourcegroup.ErrInvalid) {
		t.Fatalf("invalid UTF-8: %v", err)
	}
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "rg", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []resourcegroup.Binding{
		tag("route", "/report", "RG"),
		tag("a=b/c", "x=y, 'z' é%", "rg"),
		{User: "app", Host: "%", Group: "rg"},
	} {
		if err := st.BindUser(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, keyTags+"route=%2Freport")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the binding of route='/report' is not under its key: %v %v", resp, err)
	}
	want := []resourcegroup.Binding{{User: "app", Host: "%", Group: "rg"},
		tag("a=b/c", "x=y, 'z' é%", "rg"), tag("route", "/report", "rg")}
	bs, err := st.ListBindings(ctx)
	if err != nil || !reflect.DeepEqual(bs, want) {
		t.Fatalf("bindings:\n got  %+v, %v\n want %+v", bs, err, want)
	}
	// Binding to default removes the tag's binding, and only it.
	if err := st.BindUser(ctx, tag("a=b/c", "x=y, 'z' é%", "default")); err != nil {
		t.Fatal(err)
	}
	if bs, _ := st.ListBindings(ctx); !reflect.DeepEqual(bs, []resourcegroup.Binding{want[0], want[2]}) {
		t.Fatalf("after unbinding a tag: %+v", bs)
	}
}

// The Watch stream carries tag bindings: in its snapshot, and as PUT and
// DELETE events (the DELETE rebuilt from the key).
func TestWatchCarriesTagBindings(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 10}}); err != nil {
		t.Fatal(err)
	}
	bind := func(k, v, g string) {
		t.Helper()
		if _, err := c.BindUser(ctx, &pb.BindUserRequest{Binding: &pb.Binding{TagKey: k, TagValue: v, Group: g}}); err != nil {
			t.Fatal(err)
		}
	}
	bind("route", "/report", "a")
	w, err := c.Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, e := range snap.Events {
		if b := e.GetBinding(); b != nil {
			tags = append(tags, b.GetTagKey()+"="+b.GetTagValue()+">"+b.GetGroup()+" user="+b.GetUser())
		}
	}
	if !snap.Snapshot || !reflect.DeepEqual(tags, []string{"route=/report>a user="}) {
		t.Fatalf("snapshot's bindings = %q", tags)
	}
	bind("app", "x=1,y", "a")
	bind("app", "x=1,y", "default")
	var got []string
	for len(got) < 2 {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.Events {
			b := e.GetBinding()
			got = append(got, e.Type.String()+" "+b.GetTagKey()+"="+b.GetTagValue()+">"+b.GetGroup())
		}
	}
	if !reflect.DeepEqual(got, []string{"PUT app=x=1,y>a", "DELETE app=x=1,y>"}) {
		t.Fatalf("events = %q", got)
	}
	if _, err := c.BindUser(ctx, &pb.BindUserRequest{Binding: &pb.Binding{TagKey: "k", TagValue: "v", Group: "nope"}}); codeOf(err) != codes.NotFound {
		t.Fatalf("bind a tag to a missing group: %v", err)
	}
}
