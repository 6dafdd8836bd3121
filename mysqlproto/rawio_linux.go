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
// writes to the backend).
type rawSock struct {
	rc syscall.RawConn

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
	return r
}

func (r *rawSock) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
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
