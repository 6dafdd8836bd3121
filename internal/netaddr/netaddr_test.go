package netaddr

import "testing"

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:3379": true, "127.9.9.9:1": true, "[::1]:3379": true, "localhost:3379": true,
		"10.0.0.1:3379": false, "example.com:3379": false, "127.0.0.1": false, ":3379": false,
		"[::ffff:127.0.0.1]:1": true, "0.0.0.0:3379": false, "": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
