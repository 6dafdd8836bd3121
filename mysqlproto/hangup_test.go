package mysqlproto

import (
	"net"
	"testing"
	"time"
)

// hangupSession is a session whose client is one end of a pipe; the test
// plays the hangupSampler by calling hangupTick itself.
func hangupSession(t *testing.T) (*session, net.Conn) {
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

func TestHangupCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ticks   int    // hangupSampler ticks while Before runs
		client  string // "idle", "send" (pipelines a byte) or "leave"
		checked bool   // a hangup check reads the client
		cancel  bool   // the session's context ends
	}{
		{name: "fast Before, one tick", ticks: 1, client: "leave"},
		{name: "no tick", ticks: 0, client: "idle"},
		{name: "slow Before, idle client", ticks: 2, client: "idle", checked: true},
		{name: "slow Before, client leaves", ticks: 3, client: "leave", checked: true, cancel: true},
		{name: "slow Before, client pipelines", ticks: 2, client: "send", checked: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss, c := hangupSession(t)
			ss.beginBefore()
			for range tc.ticks {
				ss.hangupTick()
			}
			if got := ss.bgen.Load()&hangupBit != 0; got != tc.checked {
				t.Fatalf("checked = %v, want %v", got, tc.checked)
			}
			switch tc.client {
			case "leave":
				c.Close()
				if tc.checked {
					select {
					case <-ss.ctx.Done():
					case <-time.After(10 * time.Second):
						t.Fatal("context not cancelled after the client left")
					}
				}
			case "send":
				go c.Write([]byte{0x42})
				// The check sees the byte (or is woken by endBefore): either way
				// the byte stays for the next command.
			}
			ss.endBefore()
			if g := ss.bgen.Load(); g&1 != 0 || g&hangupBit != 0 {
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
					t.Fatalf("read after the check: %#x, %v", b, err)
				}
			}
			// A later Before starts from scratch: the first tick only sights it.
			ss.beginBefore()
			ss.hangupTick()
			if ss.bgen.Load()&hangupBit != 0 {
				t.Fatal("a new Before was checked on its first tick")
			}
			ss.endBefore()
		})
	}
}
