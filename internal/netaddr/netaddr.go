// Package netaddr holds the address checks both binaries make on their
// flags: whether a host:port stays on this machine decides whether a
// credential may travel over it without TLS.
package netaddr

import "net"

// IsLoopback reports whether addr (host:port) names this machine's
// loopback: "localhost" or a loopback IP. An address without a port, or
// with a host name other than localhost, is not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
