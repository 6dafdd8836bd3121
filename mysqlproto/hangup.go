package mysqlproto

import (
	"context"
	"errors"
	"os"
	"time"
)

// defaultHangupDelay is how long a policy's Before may block before the
// session starts reading the client for a disconnect. The server's
// hangupSampler samples sessions at this period, so the check starts between one
// and two periods after Before began.
const defaultHangupDelay = 20 * time.Millisecond

// hangupBit, set in session.bgen, says a goroutine is reading the client
// for the Before that bgen's low bits name.
const hangupBit = 1 << 63

// the hangup check reads the client while a policy's Before blocks, so
// that a client that goes away cancels the session's context (and so
// Before's). The fast path costs a session two atomic operations: no
// timer, channel or goroutine per statement, because arming a timer per
// statement wakes the runtime's network poller each time. Instead one
// hangupSampler per Server samples every session's Before generation (bgen,
// odd while Before runs) and starts a check for a session seen inside the
// same Before on two consecutive ticks.

// beginBefore marks the session as inside its policy's Before.
func (ss *session) beginBefore() {
	g := ss.bgen.Add(1)
	if ss.srv.hangupDelay <= 0 {
		ss.startHangupCheck(g) // tests: check at once
	}
}

// endBefore marks Before as over; when it returns the session owns its
// client reader again.
func (ss *session) endBefore() {
	for {
		g := ss.bgen.Load()
		if g&hangupBit == 0 {
			if ss.bgen.CompareAndSwap(g, g+1) {
				return
			}
			continue // the hangupSampler started a check meanwhile
		}
		_ = ss.client.SetReadDeadline(time.Unix(1, 0)) // wakes the Peek
		<-ss.hangupDone
		_ = ss.client.SetReadDeadline(time.Time{})
		ss.bgen.Store(g&^hangupBit + 1)
		return
	}
}

// startHangupCheck starts reading the client if the session is still inside the
// Before of generation g.
func (ss *session) startHangupCheck(g uint64) {
	if ss.bgen.CompareAndSwap(g, g|hangupBit) {
		go ss.awaitHangup()
	}
}

// awaitHangup waits for the client to send or leave.
func (ss *session) awaitHangup() {
	defer func() { ss.hangupDone <- struct{}{} }()
	// Peek keeps whatever the client pipelined in the buffer.
	if _, err := ss.crd.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		ss.log.Debug("client gone while the policy held its statement", "err", err)
		ss.cancel()
	}
}

// hangupTick is the hangupSampler's look at one session. hangupSeen is only used by
// the hangupSampler, under s.mu.
func (ss *session) hangupTick() {
	g := ss.bgen.Load()
	if g&1 == 1 && g&hangupBit == 0 && g == ss.hangupSeen {
		ss.startHangupCheck(g)
	}
	ss.hangupSeen = g
}

// hangupSampler samples the sessions every hangupDelay until ctx ends.
func (s *Server) hangupSampler(ctx context.Context) {
	t := time.NewTicker(s.hangupDelay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for ss := range s.sessions {
			ss.hangupTick()
		}
		s.mu.Unlock()
	}
}
