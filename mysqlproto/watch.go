package mysqlproto

import (
	"context"
	"errors"
	"os"
	"time"
)

// defaultWatchDelay is how long a policy's Before may block before the
// session starts watching the client for a disconnect. The server's
// watchdog samples sessions at this period, so the watch starts between one
// and two periods after Before began.
const defaultWatchDelay = 20 * time.Millisecond

// watchBit, set in session.bgen, says a goroutine is reading the client
// for the Before that bgen's low bits name.
const watchBit = 1 << 63

// The client watch reads the client while a policy's Before blocks, so
// that a client that goes away cancels the session's context (and so
// Before's). The fast path costs a session two atomic operations: no
// timer, channel or goroutine per statement, because arming a timer per
// statement wakes the runtime's network poller each time. Instead one
// watchdog per Server samples every session's Before generation (bgen,
// odd while Before runs) and starts a watch for a session seen inside the
// same Before on two consecutive ticks.

// beginBefore marks the session as inside its policy's Before.
func (ss *session) beginBefore() {
	g := ss.bgen.Add(1)
	if ss.srv.watchDelay <= 0 {
		ss.startWatch(g) // tests: watch at once
	}
}

// endBefore marks Before as over; when it returns the session owns its
// client reader again.
func (ss *session) endBefore() {
	for {
		g := ss.bgen.Load()
		if g&watchBit == 0 {
			if ss.bgen.CompareAndSwap(g, g+1) {
				return
			}
			continue // the watchdog started a watch meanwhile
		}
		_ = ss.client.SetReadDeadline(time.Unix(1, 0)) // wakes the Peek
		<-ss.wdone
		_ = ss.client.SetReadDeadline(time.Time{})
		ss.bgen.Store(g&^watchBit + 1)
		return
	}
}

// startWatch starts reading the client if the session is still inside the
// Before of generation g.
func (ss *session) startWatch(g uint64) {
	if ss.bgen.CompareAndSwap(g, g|watchBit) {
		go ss.watchClient()
	}
}

// watchClient waits for the client to send or leave.
func (ss *session) watchClient() {
	defer func() { ss.wdone <- struct{}{} }()
	// Peek keeps whatever the client pipelined in the buffer.
	if _, err := ss.crd.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		ss.log.Debug("client gone while the policy held its statement", "err", err)
		ss.cancel()
	}
}

// watchTick is the watchdog's look at one session. wdSeen is only used by
// the watchdog, under s.mu.
func (ss *session) watchTick() {
	g := ss.bgen.Load()
	if g&1 == 1 && g&watchBit == 0 && g == ss.wdSeen {
		ss.startWatch(g)
	}
	ss.wdSeen = g
}

// watchdog samples the sessions every watchDelay until ctx ends.
func (s *Server) watchdog(ctx context.Context) {
	t := time.NewTicker(s.watchDelay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for ss := range s.sessions {
			ss.watchTick()
		}
		s.mu.Unlock()
	}
}
