package tokenclient

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
)

// connPool holds a Client's connections to rgserver, one per address,
// dialled on first use, under a lock of its own: the streams and the
// store's calls take it only to find a connection.
type connPool struct {
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
	// rgNext is the server a ResourceGroupService call tries first: the
	// one that answered last.
	rgNext int
}

// get returns the connection to addr, dialling it with dial the first
// time; ErrClosed once the pool is closed.
func (p *connPool) get(addr string, dial func(addr string) (*grpc.ClientConn, error)) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if cc, ok := p.conns[addr]; ok {
		return cc, nil
	}
	cc, err := dial(addr) // grpc.NewClient does not block
	if err != nil {
		return nil, err
	}
	if p.conns == nil {
		p.conns = map[string]*grpc.ClientConn{}
	}
	p.conns[addr] = cc
	return cc, nil
}

// next is the index in Servers a ResourceGroupService call starts at.
func (p *connPool) next() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rgNext
}

// answered records that server idx answered a ResourceGroupService call.
func (p *connPool) answered(idx int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rgNext = idx
}

// close closes every connection; the pool dials no more.
func (p *connPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first error
	for addr, cc := range p.conns {
		if err := cc.Close(); err != nil && first == nil {
			first = fmt.Errorf("tokenclient: close %s: %w", addr, err)
		}
	}
	p.conns = nil
	p.closed = true
	return first
}
