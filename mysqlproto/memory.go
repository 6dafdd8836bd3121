package mysqlproto

import (
	"bufio"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrBudget means a client's command would take rgproxy beyond
// Config.CommandBufferLimit: the client gets ERR 1041 and is closed.
var ErrBudget = errors.New("mysqlproto: command buffer limit reached")

// What a session holds, and for how long:
//
//   - its client reader (clientReadSize), always: an idle session waits
//     for its next command in it;
//   - its command buffer (session.buf), which grows as a command's bytes
//     arrive (readPayload) and is dropped when a command that needed more
//     than keepBuf is over;
//   - the client writer and the backend reader and writer, only while it
//     works on a login or a command: between commands they go back to
//     the Server's pools (session.park), so an idle session, or one whose
//     client stalls in the middle of a command, holds none of them.

// clientReadSize is the size of a session's client reader. Small commands
// fit; larger payloads are read straight into the command buffer (a
// bufio.Reader hands reads at least its size to the connection), and
// streamed ones go through it to the backend writer.
const clientReadSize = 4 << 10

// keepBuf is the largest command buffer a session keeps between commands,
// and what it may hold without charging Config.CommandBufferLimit.
const keepBuf = 16 << 10

// backendWriteSize is the size of the pooled backend writers.
const backendWriteSize = 16 << 10

// workBufs are the buffered writers and reader a session needs only while
// it works on a login or a command: lent by a bufPool, one Get and one Put
// a command for the three.
type workBufs struct {
	cw *bufio.Writer // to the client, of Config.WriteBufferSize
	br *bufio.Reader // from the backend, of Config.WriteBufferSize
	bw *bufio.Writer // to the backend, of backendWriteSize
}

// bufPool lends workBufs (see session.acquire and session.park).
type bufPool struct{ p sync.Pool }

func newBufPool(size int) *bufPool {
	return &bufPool{p: sync.Pool{New: func() any {
		return &workBufs{cw: bufio.NewWriterSize(nil, size), br: bufio.NewReaderSize(nil, size),
			bw: bufio.NewWriterSize(nil, backendWriteSize)}
	}}}
}

func (p *bufPool) get() *workBufs { return p.p.Get().(*workBufs) }

// put takes b back, dropping what it holds and the connections it names.
func (p *bufPool) put(b *workBufs) {
	b.cw.Reset(nil)
	b.br.Reset(nil)
	b.bw.Reset(nil)
	p.p.Put(b)
}

// memBudget is the proxy-wide bound on bytes held in command buffers
// beyond each session's first keepBuf bytes.
type memBudget struct {
	limit int64
	used  atomic.Int64
}

// allowance is one session's share of a memBudget: what its command
// buffer's capacity beyond keepBuf has been charged. Used by the session
// goroutine only.
type allowance struct {
	b    *memBudget
	held int64
}

// reserve charges the budget for a buffer of capacity c; ErrBudget when
// the budget cannot cover it (nothing is charged then).
func (a *allowance) reserve(c int) error {
	need := int64(c - keepBuf)
	if a == nil || a.b == nil || need <= a.held {
		return nil
	}
	d := need - a.held
	if used := a.b.used.Add(d); used > a.b.limit {
		a.b.used.Add(-d)
		return fmt.Errorf("%w: %d bytes held for commands being received, limit %d", ErrBudget, used-d, a.b.limit)
	}
	a.held = need
	return nil
}

// release gives back everything the session was charged.
func (a *allowance) release() {
	if a.held != 0 {
		a.b.used.Add(-a.held)
		a.held = 0
	}
}
