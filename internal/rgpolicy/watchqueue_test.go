package rgpolicy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// The watches runaway statements ask for wait in a bounded queue (one
// past watchQueue is dropped, nobody blocks) until Run's goroutine adds
// them to the store; Run returns once that goroutine has stopped.
func TestRunAddsQueuedWatchesAndWaitsForThem(t *testing.T) {
	tok := testGroups()
	f := newFakePolicy(t, tok, Settings{})
	p := f.p
	p.instance = "px"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := tok.Store()
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "bound", RUPerSec: 100}); err != nil {
		t.Fatal(err)
	}
	// No DURATION: the store keeps real time, the policy a fake clock.
	rule := resourcegroup.QueryLimit{Action: resourcegroup.ActionKill, Watch: resourcegroup.WatchExact}
	// Before Run: the last one finds the queue full.
	for i := range watchQueue + 1 {
		p.queueWatch("bound", rule, fmt.Sprintf("SELECT %d", i), "")
	}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	ws := st.(resourcegroup.WatchStore)
	var got []resourcegroup.Watch
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var err error
		if got, err = ws.ListWatches(ctx); err != nil {
			t.Fatal(err)
		}
		if len(got) >= watchQueue {
			break
		}
	}
	if len(got) != watchQueue {
		t.Fatalf("%d watches added, want the %d the queue held", len(got), watchQueue)
	}
	w := got[0]
	if w.Group != "bound" || w.Match != resourcegroup.WatchExact || w.Text != "SELECT 0" || w.Source != "px" ||
		w.Action != resourcegroup.ActionKill || !w.Expires.IsZero() {
		t.Fatalf("the first watch: %+v", w)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
