package tokenserver

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// A group or a tag stored under the looser rules of earlier versions (a
// name with a space, a bidirectional override, a quote; a tag value with a
// control character) stays usable: rgserver reads it, grants its tokens,
// alters it, binds to it and drops it. Only creating such a name or tag
// is refused.
func TestLegacyNamesStayUsable(t *testing.T) {
	cli := startEtcd(t)
	st := NewEtcdStore(cli)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.EnsureDefault(ctx); err != nil {
		t.Fatal(err)
	}
	const legacy = "old group\u202e'"
	val, err := encodeGroup(resourcegroup.Group{Name: legacy, RUPerSec: 10})
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := json.Marshal(bindingRecord{Group: legacy})
	if _, err := cli.Put(ctx, settingsKey(legacy), string(val)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, tagKey("route", "a\x01b"), string(tag)); err != nil {
		t.Fatal(err)
	}

	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "new group", RUPerSec: 1}); !errors.Is(err, resourcegroup.ErrInvalid) {
		t.Errorf("creating a name with a space: %v, want ErrInvalid", err)
	}
	if err := st.BindUser(ctx, resourcegroup.Binding{TagKey: "route", TagValue: "x\x01", Group: legacy}); !errors.Is(err, resourcegroup.ErrInvalid) {
		t.Errorf("binding a tag with a control character: %v, want ErrInvalid", err)
	}
	g, err := st.GetGroup(ctx, legacy)
	if err != nil || g.RUPerSec != 10 {
		t.Fatalf("GetGroup(legacy) = %+v, %v", g, err)
	}
	g.RUPerSec = 20
	if err := st.AlterGroup(ctx, g); err != nil {
		t.Errorf("AlterGroup(legacy): %v", err)
	}
	if err := st.BindUser(ctx, resourcegroup.Binding{User: "app", Host: "%", Group: legacy}); err != nil {
		t.Errorf("binding an account to the legacy group: %v", err)
	}
	ts := startServer(t, cli, "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp := acquire(t, s, &pb.TokenRequest{ProxyId: "p1", RequestId: 1,
		Groups: []*pb.GroupTokenRequest{{Group: legacy, TokensWanted: 5, DemandRuPerSec: 1}}})
	if len(resp.Grants) != 1 || resp.Grants[0].Error != "" || resp.Grants[0].Tokens != 5 {
		t.Errorf("tokens for the legacy group: %v", resp)
	}
	bs, err := st.ListBindings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tagged := false
	for _, b := range bs {
		tagged = tagged || b.IsTag() && b.TagValue == "a\x01b" && b.Group == legacy
	}
	if !tagged {
		t.Errorf("the legacy tag binding is not listed: %+v", bs)
	}
	// DROP RESOURCE GROUP BINDING stores the tag's binding to default.
	if err := st.BindUser(ctx, resourcegroup.Binding{TagKey: "route", TagValue: "a\x01b", Group: resourcegroup.DefaultGroup}); err != nil {
		t.Errorf("dropping the legacy tag binding: %v", err)
	}
	if err := st.DropGroup(ctx, legacy); err != nil {
		t.Errorf("DropGroup(legacy): %v", err)
	}
	if _, err := st.GetGroup(ctx, legacy); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Errorf("after the drop: %v", err)
	}
}
