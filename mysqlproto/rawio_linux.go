package mysqlproto

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawSock reads and writes a TCP connection with raw read(2)/write(2)
// calls inside syscall.RawConn, which still parks the goroutine on the
// network poller when the socket is not ready (and so honours deadlines
// and Close). The socket is non-blocking, so each call returns at once;
// skipping the runtime's syscall bookkeeping matters because a session
// makes a read and a write per statement leg and, at low concurrency,
// each tracked syscall wakes the runtime's sysmon thread, which measured
// as a quarter of the proxy's CPU at one client.
//
// Reads and writes keep separate state, as a net.Conn may be read and
// written from two goroutines (the hangup check reads while the session
// writes to the backend). A write deferred by deferNext is the exception:
// the next Read sends it, so only a socket that one goroutine both writes
// and reads may defer.
type rawSock struct {
	rc syscall.RawConn

	// deferNext makes the next Write keep its bytes, unsent, for the next
	// Read to send (sendThenRead); the caller promises that Read comes
	// next and that the bytes stay as they are until it does. pending
	// holds them.
	deferNext bool
	pending   []byte
	sfn       func(fd uintptr) bool // doSendRead, bound once

	rbuf []byte
	rn   int
	rerr error
	rfn  func(fd uintptr) bool // doRead, bound once: no allocation per call

	wbuf []byte
	wn   int
	werr error
	wfn  func(fd uintptr) bool
}

// newRawSock returns nil when c is not a plain TCP connection.
func newRawSock(c net.Conn) *rawSock {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawSock{rc: rc}
	r.rfn = r.doRead
	r.wfn = r.doWrite
	r.sfn = r.doSendRead
	return r
}

func (r *rawSock) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if r.pending != nil {
		return r.sendThenRead(b)
	}
	r.rbuf, r.rn, r.rerr = b, 0, nil
	err := r.rc.Read(r.rfn)
	r.rbuf = nil
	if err != nil {
		return 0, err
	}
	return r.rn, r.rerr
}

// doRead makes one read; false asks RawConn to wait until readable.
func (r *rawSock) doRead(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&r.rbuf[0])), uintptr(len(r.rbuf)))
		switch e {
		case 0:
			r.rn = int(n)
			if n == 0 {
				r.rerr = io.EOF
			}
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			r.rerr = &net.OpError{Op: "read", Net: "tcp", Err: e}
			return true
		}
	}
}

func (r *rawSock) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if r.deferNext {
		r.deferNext = false
		r.pending = b
		return len(b), nil
	}
	if p := r.pending; p != nil {
		// Not the Read it was kept for: send it first, in order.
		r.pending = nil
		if _, err := r.Write(p); err != nil {
			return 0, err
		}
	}
	r.wbuf, r.wn, r.werr = b, 0, nil
	err := r.rc.Write(r.wfn)
	r.wbuf = nil
	if err == nil {
		err = r.werr
	}
	return r.wn, err
}

// doWrite writes until done; false asks RawConn to wait until writable.
func (r *rawSock) doWrite(fd uintptr) bool {
	for r.wn < len(r.wbuf) {
		p := r.wbuf[r.wn:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case 0:
			r.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			r.werr = &net.OpError{Op: "write", Net: "tcp", Err: e}
			return true
		}
	}
	return true
}

// setDeferNext sets or clears deferNext.
func (r *rawSock) setDeferNext(on bool) { r.deferNext = on }

// sendThenRead sends the deferred write and reads its answer within one
// RawConn.Read. A plain Read starts by forgetting the poller's last
// readiness report, so it must try read(2) first and, as the answer is
// not there yet, finds the socket empty: a wasted system call per
// request. Here the forgetting comes before the request leaves, so any
// answer is reported and the read waits for it without trying first.
func (r *rawSock) sendThenRead(b []byte) (int, error) {
	r.wbuf, r.wn, r.werr = r.pending, 0, nil
	r.pending = nil
	r.rbuf, r.rn, r.rerr = b, 0, nil
	err := r.rc.Read(r.sfn)
	if err == nil && r.werr == nil && r.wn < len(r.wbuf) {
		// The socket's send buffer filled: the rest waits for room, as
		// in Write, and then the answer is read the plain way.
		err = r.rc.Write(r.wfn)
		if err == nil && r.werr == nil {
			err = r.rc.Read(r.rfn)
		}
	}
	r.rbuf, r.wbuf = nil, nil
	if err == nil {
		err = r.werr
	}
	if err != nil {
		return 0, err
	}
	return r.rn, r.rerr
}

// doSendRead sends the request, then asks RawConn to wait until readable,
// then reads. It returns at once if the send fails or finds no room.
func (r *rawSock) doSendRead(fd uintptr) bool {
	if r.wn < len(r.wbuf) {
		// doWrite's false is no room: return, and sendThenRead sends
		// the rest; after a whole send, wait unless it failed.
		return !r.doWrite(fd) || r.werr != nil
	}
	return r.doRead(fd)
}
