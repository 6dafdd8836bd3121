//go:build !linux

package mysqlproto

import "net"

// rawSock is Linux-only; elsewhere connections use net.Conn's own I/O.
type rawSock struct{}

func newRawSock(net.Conn) *rawSock { return nil }

func (*rawSock) Read([]byte) (int, error)  { panic("unreachable") }
func (*rawSock) Write([]byte) (int, error) { panic("unreachable") }
func (*rawSock) setDeferNext(bool)         {}
