package tokenclient

import (
	"context"
	"sync/atomic"
	"testing"
)

// loops runs a loop only between begin and stop, gives each its own
// context, and stop cancels every loop and returns once all returned.
func TestLoopsOwnTheirGoroutines(t *testing.T) {
	var l loops
	if l.start(func(context.Context) { t.Error("a loop ran before begin") }) {
		t.Fatal("start before begin")
	}
	if l.running() {
		t.Fatal("running before begin")
	}
	if !l.begin() || l.begin() {
		t.Fatal("begin must succeed exactly once")
	}
	var returned atomic.Int32
	started := make(chan struct{}, 3)
	for range 3 {
		if !l.start(func(ctx context.Context) {
			started <- struct{}{}
			<-ctx.Done()
			returned.Add(1)
		}) {
			t.Fatal("start after begin")
		}
	}
	for range 3 {
		<-started
	}
	l.stop()
	if n := returned.Load(); n != 3 {
		t.Fatalf("stop returned with %d of 3 loops returned", n)
	}
	if l.running() || l.start(func(context.Context) { t.Error("a loop ran after stop") }) {
		t.Fatal("start after stop")
	}
	l.stop() // idempotent
}
