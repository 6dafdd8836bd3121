package mysqlproto

import (
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// backendPoller tells sessions when their backend connection closes (FIN,
// RST) while nothing reads it, so that an idle session passes the close on
// to its client at once. One epoll instance per Server holds every
// session's backend socket, registered once at login for EPOLLRDHUP only
// and edge-triggered: response data never wakes it, and a session costs no
// system call per statement. The epoll descriptor itself sits in Go's
// network poller, so polling takes no thread and no goroutine per session.
type backendPoller struct {
	log *slog.Logger
	f   *os.File // the epoll instance, non-blocking
	rc  syscall.RawConn

	closed atomic.Bool

	mu       sync.Mutex
	sessions map[uint64]*session
}

func newBackendPoller(log *slog.Logger) (*backendPoller, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("mysqlproto: epoll_create1: %w", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("mysqlproto: epoll non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "mysqlproto-backend-poll")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mysqlproto: backend poller: %w", err)
	}
	return &backendPoller{log: log, f: f, rc: rc, sessions: make(map[uint64]*session)}, nil
}

// add starts polling ss's backend socket. A session whose backend is not
// a plain TCP connection is not polled.
func (w *backendPoller) add(ss *session) {
	if w == nil || ss.rawBackend == nil || ss.rawBackend.raw == nil {
		return
	}
	id := ss.info.ID
	w.mu.Lock()
	w.sessions[id] = ss
	w.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | -syscall.EPOLLET, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var cerr error
	err := w.rc.Control(func(epfd uintptr) {
		err := ss.rawBackend.raw.rc.Control(func(fd uintptr) {
			cerr = syscall.EpollCtl(int(epfd), syscall.EPOLL_CTL_ADD, int(fd), &ev)
		})
		if cerr == nil {
			cerr = err
		}
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		w.remove(id)
		ss.log.Warn("cannot poll the backend connection; a close by the backend is seen at the next statement", "err", err)
	}
}

// remove stops routing events to session id: when it returns, the poller
// is not inside the session's backendClosed and will not call it again
// (backendUnreachable relies on that to own its client's deadline). The
// kernel drops the socket from the epoll set when the socket closes.
func (w *backendPoller) remove(id uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.sessions, id)
	w.mu.Unlock()
}

// run hands events to their sessions until close.
func (w *backendPoller) run() {
	events := make([]syscall.EpollEvent, 64)
	var n int
	var werr error
	wait := func(fd uintptr) bool {
		for {
			n, werr = syscall.EpollWait(int(fd), events, 0)
			if werr != syscall.EINTR {
				return werr != nil || n > 0 // nothing ready: park in the poller
			}
		}
	}
	for {
		if err := w.rc.Read(wait); err != nil {
			if !w.closed.Load() {
				w.log.Warn("backend poller stopped; closes by the backend are seen at the next statement", "err", err)
			}
			return
		}
		if werr != nil {
			w.log.Warn("backend poller stopped; closes by the backend are seen at the next statement", "err", werr)
			return
		}
		for _, ev := range events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			// Under mu, so that remove is a barrier: once it returns, the
			// session's client deadline is its own again.
			w.mu.Lock()
			if ss := w.sessions[id]; ss != nil {
				ss.backendClosed()
			}
			w.mu.Unlock()
		}
	}
}

func (w *backendPoller) close() {
	w.closed.Store(true)
	_ = w.f.Close()
}
