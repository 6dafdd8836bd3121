package mysqlproto

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		done <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-done
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func TestRawSock(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, r *rawSock, peer *net.TCPConn, own *net.TCPConn)
	}{
		{"round trip", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			if n, err := r.Write([]byte("ping")); n != 4 || err != nil {
				t.Fatalf("write: %d, %v", n, err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(peer, got); err != nil || string(got) != "ping" {
				t.Fatalf("peer read %q, %v", got, err)
			}
			go peer.Write([]byte("pong"))
			b := make([]byte, 16)
			n, err := r.Read(b) // waits on the poller: nothing is there yet
			if err != nil || string(b[:n]) != "pong" {
				t.Fatalf("read %q, %v", b[:n], err)
			}
		}},
		{"empty buffers", func(t *testing.T, r *rawSock, _, _ *net.TCPConn) {
			if n, err := r.Read(nil); n != 0 || err != nil {
				t.Fatalf("read: %d, %v", n, err)
			}
			if n, err := r.Write(nil); n != 0 || err != nil {
				t.Fatalf("write: %d, %v", n, err)
			}
		}},
		{"EOF when the peer closes", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			peer.Close()
			if _, err := r.Read(make([]byte, 8)); !errors.Is(err, io.EOF) {
				t.Fatalf("read after peer close: %v", err)
			}
		}},
		{"read deadline", func(t *testing.T, r *rawSock, _, own *net.TCPConn) {
			_ = own.SetReadDeadline(time.Unix(1, 0))
			if _, err := r.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past deadline: %v", err)
			}
		}},
		{"close wakes a blocked read", func(t *testing.T, r *rawSock, _, own *net.TCPConn) {
			errc := make(chan error, 1)
			go func() {
				_, err := r.Read(make([]byte, 8))
				errc <- err
			}()
			own.Close() // whether the read has parked yet or not, it ends with ErrClosed
			if err := <-errc; !errors.Is(err, net.ErrClosed) {
				t.Fatalf("read on closed conn: %v", err)
			}
		}},
		{"large write waits for the reader", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than the socket buffers
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
				got <- b
			}()
			if n, err := r.Write(big); n != len(big) || err != nil {
				t.Fatalf("write: %d, %v", n, err)
			}
			if !bytes.Equal(<-got, big) {
				t.Fatal("peer got other bytes")
			}
		}},
		{"write to a reset connection", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			_ = peer.SetLinger(0)
			peer.Close() // RST, delivered on loopback before Close returns
			var err error
			for range 2 { // the first write may only provoke the error
				if _, err = r.Write([]byte("x")); err != nil {
					break
				}
			}
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("write after reset: %v", err)
			}
		}},
		{"deferred write leaves with the next read", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			r.setDeferNext(true)
			if n, err := r.Write([]byte("query")); n != 5 || err != nil {
				t.Fatalf("deferred write: %d, %v", n, err)
			}
			if r.deferNext {
				t.Fatal("deferNext outlived the write it deferred")
			}
			// Nothing is sent before the read: the peer sees no byte.
			_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if n, err := peer.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("peer read %d bytes (%v) before the read that sends them", n, err)
			}
			_ = peer.SetReadDeadline(time.Time{})
			go func() {
				got := make([]byte, 5)
				if _, err := io.ReadFull(peer, got); err == nil && string(got) == "query" {
					_, _ = peer.Write([]byte("answer"))
				} else {
					peer.Close()
				}
			}()
			b := make([]byte, 16)
			n, err := r.Read(b)
			if err != nil || string(b[:n]) != "answer" {
				t.Fatalf("read %q, %v", b[:n], err)
			}
			if r.pending != nil {
				t.Fatal("the request is still pending after the read")
			}
			// The next exchange is a plain one.
			go func() { _, _ = peer.Write([]byte("more")) }()
			if n, err := r.Read(b); err != nil || string(b[:n]) != "more" {
				t.Fatalf("plain read after: %q, %v", b[:n], err)
			}
		}},
		{"deferred write followed by a write keeps the order", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			r.setDeferNext(true)
			_, _ = r.Write([]byte("first "))
			if n, err := r.Write([]byte("second")); n != 6 || err != nil {
				t.Fatalf("write: %d, %v", n, err)
			}
			got := make([]byte, 12)
			if _, err := io.ReadFull(peer, got); err != nil || string(got) != "first second" {
				t.Fatalf("peer read %q, %v", got, err)
			}
		}},
		{"deferred large write waits for room, then for the answer", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: more than the socket buffers
			ok := make(chan bool, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
				ok <- bytes.Equal(b, big)
				_, _ = peer.Write([]byte("done"))
			}()
			r.setDeferNext(true)
			if n, err := r.Write(big); n != len(big) || err != nil {
				t.Fatalf("deferred write: %d, %v", n, err)
			}
			b := make([]byte, 16)
			n, err := r.Read(b)
			if err != nil || string(b[:n]) != "done" {
				t.Fatalf("read %q, %v", b[:n], err)
			}
			if !<-ok {
				t.Fatal("peer got other bytes")
			}
		}},
		{"deferred write to a reset connection fails the read", func(t *testing.T, r *rawSock, peer, _ *net.TCPConn) {
			_ = peer.SetLinger(0)
			peer.Close()
			var err error
			for range 2 { // the first write may only provoke the error
				r.setDeferNext(true)
				_, _ = r.Write([]byte("x"))
				if _, err = r.Read(make([]byte, 8)); err != nil {
					break
				}
			}
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("read after a deferred write to a reset connection: %v", err)
			}
		}},
		{"deferred write and a past read deadline", func(t *testing.T, r *rawSock, peer, own *net.TCPConn) {
			r.setDeferNext(true)
			_, _ = r.Write([]byte("x"))
			_ = own.SetReadDeadline(time.Unix(1, 0))
			if _, err := r.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past deadline: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own, peer := tcpPair(t)
			r := newRawSock(own)
			if r == nil {
				t.Fatal("no rawSock for a TCP connection")
			}
			tc.run(t, r, peer, own)
		})
	}
	if newRawSock(discardConn{}) != nil {
		t.Fatal("rawSock for a non-TCP connection")
	}
}
