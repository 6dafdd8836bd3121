package tests

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// watchClient starts a real tokenclient.Client (what each rgproxy runs)
// against rgserver addr.
func watchClient(t *testing.T, addr, proxyID string) (*tokenclient.Client, resourcegroup.WatchStore) {
	t.Helper()
	c, err := tokenclient.New(tokenclient.Config{Servers: []string{addr}, ProxyID: proxyID})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ws, ok := c.Store().(resourcegroup.WatchStore)
	if !ok {
		t.Fatal("tokenclient's Store does not implement resourcegroup.WatchStore")
	}
	return c, ws
}

// watchWaitUntil polls cond every 10 ms until it holds or limit passes, and
// returns how long it took.
func watchWaitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// A watch added through one proxy's client reaches another proxy's cache
// within 1 s through rgserver's Watch stream, stops matching when its
// duration ends, and is deleted from etcd by its lease; a removal also
// spreads within 1 s.
func TestWatchListSharedThroughRGServer(t *testing.T) {
	ts := startTokenServer(t)
	c1, st1 := watchClient(t, ts.Addr, "watch-proxy-1")
	c2, st2 := watchClient(t, ts.Addr, "watch-proxy-2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A raw Watch stream, to see rgserver's own DELETE when the lease ends.
	cc, err := grpc.NewClient(ts.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := tokenpb.NewResourceGroupServiceClient(cc).Watch(ctx, &tokenpb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the snapshot
		t.Fatal(err)
	}

	if err := c1.Store().CreateGroup(ctx, resourcegroup.Group{Name: "rg1", RUPerSec: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := st1.AddWatch(ctx, resourcegroup.Watch{Group: "nope", Match: resourcegroup.WatchExact, Text: "x"}); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Fatalf("watch on an unknown group = %v, want ErrNotFound", err)
	}

	const duration = 3 * time.Second
	expires := time.Now().Add(duration)
	exact, err := st1.AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchExact,
		Text: "SELECT SLEEP(5)", Action: resourcegroup.ActionKill, Source: "watch-proxy-1", Expires: expires})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c1.MatchWatch("SELECT SLEEP(5)", ""); !ok {
		t.Fatal("the adding proxy does not see its own watch")
	}
	took := watchWaitUntil(t, "the watch on the other proxy", time.Second, func() bool {
		w, ok := c2.MatchWatch("SELECT SLEEP(5)", "")
		return ok && w.ID == exact.ID
	})
	t.Logf("watch %d reached the other proxy in %v", exact.ID, took)

	// The same target added by the other proxy is the same global entry.
	if dup, err := st2.AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchExact,
		Text: "SELECT SLEEP(5)", Source: "watch-proxy-2"}); err != nil || dup.ID != exact.ID {
		t.Fatalf("duplicate through the other proxy = %+v, %v", dup, err)
	}

	similar, err := st2.AddWatch(ctx, resourcegroup.Watch{Group: "rg1", Match: resourcegroup.WatchSimilar,
		Text: "watch-digest", Action: resourcegroup.ActionDryRun, Source: resourcegroup.WatchSourceManual})
	if err != nil {
		t.Fatal(err)
	}
	if similar.ID == exact.ID {
		t.Fatalf("ids not unique: %d", similar.ID)
	}
	watchWaitUntil(t, "the similar watch on the first proxy", time.Second, func() bool {
		_, ok := c1.MatchWatch("SELECT SLEEP(6)", "watch-digest")
		return ok
	})
	if err := st1.RemoveWatch(ctx, similar.ID); err != nil {
		t.Fatal(err)
	}
	watchWaitUntil(t, "the removal on the other proxy", time.Second, func() bool {
		_, ok := c2.MatchWatch("", "watch-digest")
		return !ok
	})
	if err := st2.RemoveWatch(ctx, similar.ID); !errors.Is(err, resourcegroup.ErrWatchNotFound) {
		t.Fatalf("removing twice = %v, want ErrWatchNotFound", err)
	}

	// Expiry: both proxies stop matching at the end of the duration.
	watchWaitUntil(t, "expiry on both proxies", duration+time.Second, func() bool {
		_, ok1 := c1.MatchWatch("SELECT SLEEP(5)", "")
		_, ok2 := c2.MatchWatch("SELECT SLEEP(5)", "")
		return !ok1 && !ok2
	})
	if early := time.Until(expires); early > 50*time.Millisecond {
		t.Fatalf("watch stopped matching %v before it expires", early)
	}
	if ws, err := st2.ListWatches(ctx); err != nil || len(ws) != 0 {
		t.Fatalf("live watches after expiry = %+v, %v", ws, err)
	}
	// etcd's lease deletes the entry, and rgserver streams the DELETE.
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for the expiry DELETE: %v", err)
		}
		for _, e := range resp.GetEvents() {
			if e.GetType() == tokenpb.WatchEvent_DELETE && e.GetWatch().GetId() == exact.ID {
				if late := time.Since(expires); late > 3*time.Second {
					t.Fatalf("lease deleted the entry %v after it expired", late)
				}
				return
			}
		}
	}
}
