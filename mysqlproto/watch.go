package mysqlproto

import (
	"errors"
	"os"
	"sync"
	"time"
)

// defaultWatchDelay is how long a policy's Before may block before the
// session starts watching the client for a disconnect.
const defaultWatchDelay = 20 * time.Millisecond

// clientWatch reads the client while a policy's Before blocks, so that a
// client that goes away cancels the session's context (and so Before's).
// Started from a timer only when Before is slow: the common, fast path
// costs one timer.
type clientWatch struct {
	ss    *session
	timer *time.Timer
	mu    sync.Mutex
	state uint8 // 0 pending, 1 reading, 2 stopped
	done  chan struct{}
}

func (ss *session) startWatch() *clientWatch {
	w := &clientWatch{ss: ss, done: make(chan struct{})}
	w.timer = time.AfterFunc(ss.srv.watchDelay, w.run)
	return w
}

func (w *clientWatch) run() {
	w.mu.Lock()
	if w.state == 2 {
		w.mu.Unlock()
		return
	}
	w.state = 1
	w.mu.Unlock()
	defer close(w.done)
	// Peek keeps whatever the client pipelined in the buffer.
	if _, err := w.ss.crd.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		w.ss.log.Debug("client gone while the policy held its statement", "err", err)
		w.ss.cancel()
	}
}

// stop ends the watch; when it returns, the session owns its reader again.
func (w *clientWatch) stop() {
	if w.timer.Stop() {
		return
	}
	w.mu.Lock()
	if w.state == 0 {
		w.state = 2
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	_ = w.ss.client.SetReadDeadline(time.Unix(1, 0)) // wakes the Peek
	<-w.done
	_ = w.ss.client.SetReadDeadline(time.Time{})
}
