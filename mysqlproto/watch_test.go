package mysqlproto

import (
	"net"
	"testing"
	"time"
)

// watchSession is a session whose client is one end of a pipe; the test
// plays the watchdog by calling watchTick itself.
func watchSession(t *testing.T) (*session, net.Conn) {
	t.Helper()
	s, err := NewServer(Config{Policy: &nopPolicy{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srvEnd, cliEnd := net.Pipe()
	t.Cleanup(func() { srvEnd.Close(); cliEnd.Close() })
	ss := newSession(s, srvEnd)
	t.Cleanup(ss.cancel)
	return ss, cliEnd
}

func TestClientWatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ticks   int    // watchdog ticks while Before runs
		client  string // "idle", "send" (pipelines a byte) or "leave"
		watched bool   // a watch reads the client
		cancel  bool   // the session's context ends
	}{
		{name: "fast Before, one tick", ticks: 1, client: "leave"},
		{name: "no tick", ticks: 0, client: "idle"},
		{name: "slow Before, idle client", ticks: 2, client: "idle", watched: true},
		{name: "slow Before, client leaves", ticks: 3, client: "leave", watched: true, cancel: true},
		{name: "slow Before, client pipelines", ticks: 2, client: "send", watched: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss, c := watchSession(t)
			ss.beginBefore()
			for range tc.ticks {
				ss.watchTick()
			}
			if got := ss.bgen.Load()&watchBit != 0; got != tc.watched {
				t.Fatalf("watched = %v, want %v", got, tc.watched)
			}
			switch tc.client {
			case "leave":
				c.Close()
				if tc.watched {
					select {
					case <-ss.ctx.Done():
					case <-time.After(10 * time.Second):
						t.Fatal("context not cancelled after the client left")
					}
				}
			case "send":
				go c.Write([]byte{0x42})
				// The watch sees the byte (or is woken by endBefore): either way
				// the byte stays for the next command.
			}
			ss.endBefore()
			if g := ss.bgen.Load(); g&1 != 0 || g&watchBit != 0 {
				t.Fatalf("bgen %#x after endBefore", g)
			}
			if got := ss.ctx.Err() != nil; got != tc.cancel {
				t.Fatalf("cancelled = %v, want %v", got, tc.cancel)
			}
			if tc.client == "send" {
				_ = ss.client.SetReadDeadline(time.Now().Add(10 * time.Second))
				if b, err := ss.crd.ReadByte(); err != nil || b != 0x42 {
					t.Fatalf("pipelined byte: %#x, %v", b, err)
				}
			}
			if tc.client == "idle" {
				// The reader is usable again: no deadline left behind.
				go c.Write([]byte{7})
				if b, err := ss.crd.ReadByte(); err != nil || b != 7 {
					t.Fatalf("read after the watch: %#x, %v", b, err)
				}
			}
			// A later Before starts from scratch: the first tick only sights it.
			ss.beginBefore()
			ss.watchTick()
			if ss.bgen.Load()&watchBit != 0 {
				t.Fatal("a new Before was watched on its first tick")
			}
			ss.endBefore()
		})
	}
}
