package mysqlproto

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// Framing errors.
var (
	// ErrPacketTooLarge means a payload exceeds the configured limit.
	ErrPacketTooLarge = errors.New("mysqlproto: packet payload too large")
	// ErrMalformedPacket means a packet does not have the expected shape.
	ErrMalformedPacket = errors.New("mysqlproto: malformed packet")
	// ErrSequence means a packet carries an unexpected sequence id.
	ErrSequence = errors.New("mysqlproto: packet out of sequence")
)

// readHeader reads a 4-byte packet header: a 3-byte little-endian payload
// length and the sequence id. It does not allocate.
func readHeader(br *bufio.Reader) (n int, seq byte, err error) {
	h, err := br.Peek(4)
	if err != nil {
		if errors.Is(err, io.EOF) && len(h) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	n = int(h[0]) | int(h[1])<<8 | int(h[2])<<16
	seq = h[3]
	_, _ = br.Discard(4)
	return n, seq, nil
}

// growChunk is the first allocation for a payload that does not fit the
// buffer at hand. From there a buffer doubles as bytes arrive, so that it
// is never larger than twice what came (and this chunk): a header that
// announces 16 MiB and is followed by 1 KiB costs 4 KiB, not 16 MiB.
const growChunk = 4 << 10

// readPayload appends n bytes read from br to buf and returns the filled
// slice. When buf has no room it grows as the bytes actually arrive,
// never to the announced size at once; acct, when not nil, is charged
// for each growth and may refuse it (ErrBudget). buf is reused across
// calls by the caller, so a payload that fits costs no allocation.
func readPayload(br *bufio.Reader, buf []byte, n int, acct *allowance) ([]byte, error) {
	end := len(buf) + n
	if cap(buf) >= end {
		buf = buf[:end]
		if _, err := io.ReadFull(br, buf[end-n:]); err != nil {
			return buf, unexpectedEOF(err)
		}
		return buf, nil
	}
	for len(buf) < end {
		if len(buf) == cap(buf) {
			c := min(max(2*cap(buf), growChunk), max(end, growChunk))
			if acct != nil {
				if err := acct.reserve(c); err != nil {
					return buf, err
				}
			}
			nb := make([]byte, len(buf), c)
			copy(nb, buf)
			buf = nb
		}
		k, err := br.Read(buf[len(buf):min(end, cap(buf))])
		buf = buf[:len(buf)+k]
		if err != nil && len(buf) < end {
			return buf, unexpectedEOF(err)
		}
	}
	return buf, nil
}

// unexpectedEOF turns io.EOF in the middle of a payload into
// io.ErrUnexpectedEOF.
func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readMessage reads one logical payload, joining continuation packets,
// refusing payloads larger than limit. It returns the payload (in buf when
// it fits, else in a buffer that grew as the bytes came) and the sequence
// id of the last packet. It does not check sequence ids: the backend's
// packets are read with it; a client's go through session.readClient.
func readMessage(br *bufio.Reader, buf []byte, limit int64) ([]byte, byte, error) {
	buf = buf[:0]
	for {
		n, seq, err := readHeader(br)
		if err != nil {
			return buf, 0, err
		}
		if int64(len(buf)+n) > limit {
			return buf, seq, fmt.Errorf("%w: more than %d bytes", ErrPacketTooLarge, limit)
		}
		if buf, err = readPayload(br, buf, n, nil); err != nil {
			return buf, seq, err
		}
		if n < mysql.MaxPayloadLen {
			return buf, seq, nil
		}
	}
}

// writeHeader writes a packet header for a payload of n bytes (n < 1<<24).
// Byte by byte, because a slice handed to Write escapes and would cost an
// allocation per packet.
func writeHeader(bw *bufio.Writer, n int, seq byte) error {
	if bw.Available() < 4 {
		if err := bw.Flush(); err != nil {
			return err
		}
	}
	_ = bw.WriteByte(byte(n))
	_ = bw.WriteByte(byte(n >> 8))
	_ = bw.WriteByte(byte(n >> 16))
	return bw.WriteByte(seq)
}

// writeMessage writes a logical payload, split into packets of at most
// maxChunk bytes (with an empty trailing packet when the payload is an
// exact multiple), and returns the next sequence id.
func writeMessage(bw *bufio.Writer, seq byte, payload []byte) (byte, error) {
	for {
		n := min(len(payload), mysql.MaxPayloadLen)
		if err := writeHeader(bw, n, seq); err != nil {
			return seq, err
		}
		if _, err := bw.Write(payload[:n]); err != nil {
			return seq, err
		}
		seq++
		payload = payload[n:]
		if n < mysql.MaxPayloadLen {
			return seq, nil
		}
	}
}

// copyN streams n bytes from br to bw without an intermediate buffer: it
// hands bw whatever br already holds, so bytes are relayed as they arrive.
// When br holds nothing and more than its size is to come, it reads
// straight into bw's free space (a session's client reader is small; its
// backend writer is not).
func copyN(bw *bufio.Writer, br *bufio.Reader, n int) error {
	for n > 0 {
		if br.Buffered() == 0 {
			if n >= br.Size() {
				if done, err := readIntoWriter(bw, br, n); err != nil || done > 0 {
					n -= done
					if err != nil {
						return err
					}
					continue
				}
			}
			if _, err := br.Peek(1); err != nil {
				return unexpectedEOF(err)
			}
		}
		k := min(br.Buffered(), n)
		b, _ := br.Peek(k)
		if _, err := bw.Write(b); err != nil {
			return &writeError{err}
		}
		_, _ = br.Discard(k)
		n -= k
	}
	return nil
}

// readIntoWriter makes one read of at most n bytes from br, which holds none,
// straight into bw's free space, when bw has room for a read of br's size
// (flushing it first if need be); done is 0 when it has not.
func readIntoWriter(bw *bufio.Writer, br *bufio.Reader, n int) (done int, err error) {
	if bw.Available() < br.Size() && bw.Buffered() > 0 {
		if err := bw.Flush(); err != nil {
			return 0, &writeError{err}
		}
	}
	if bw.Available() < br.Size() {
		return 0, nil
	}
	free := bw.AvailableBuffer()
	k, err := br.Read(free[:min(n, cap(free))])
	if k > 0 {
		if _, werr := bw.Write(free[:k]); werr != nil { // into its own free space: no copy
			return k, &writeError{werr}
		}
	}
	if err != nil && k < n {
		return k, unexpectedEOF(err)
	}
	return k, nil
}

// writeError marks a failed write inside copyN, so that callers can tell
// which side of the relay failed.
type writeError struct{ err error }

func (e *writeError) Error() string { return "write: " + e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// discardN skips n bytes of br.
func discardN(br *bufio.Reader, n int) error {
	_, err := br.Discard(n)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// lenenc decodes a length-encoded integer at the start of b. ok is false
// when b is too short or starts with 0xfb/0xff, which are not integers.
func lenenc(b []byte) (v uint64, size int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	switch c := b[0]; {
	case c < 0xfb:
		return uint64(c), 1, true
	case c == 0xfc:
		if len(b) < 3 {
			return 0, 0, false
		}
		return uint64(b[1]) | uint64(b[2])<<8, 3, true
	case c == 0xfd:
		if len(b) < 4 {
			return 0, 0, false
		}
		return uint64(b[1]) | uint64(b[2])<<8 | uint64(b[3])<<16, 4, true
	case c == 0xfe:
		if len(b) < 9 {
			return 0, 0, false
		}
		var v uint64
		for i := 8; i >= 1; i-- {
			v = v<<8 | uint64(b[i])
		}
		return v, 9, true
	default:
		return 0, 0, false
	}
}

// appendLenenc appends v as a length-encoded integer.
func appendLenenc(b []byte, v uint64) []byte {
	switch {
	case v < 0xfb:
		return append(b, byte(v))
	case v < 1<<16:
		return append(b, 0xfc, byte(v), byte(v>>8))
	case v < 1<<24:
		return append(b, 0xfd, byte(v), byte(v>>8), byte(v>>16))
	default:
		return append(b, 0xfe, byte(v), byte(v>>8), byte(v>>16), byte(v>>24),
			byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
	}
}

// appendLenencString appends a length-encoded string.
func appendLenencString(b []byte, s string) []byte {
	return append(appendLenenc(b, uint64(len(s))), s...)
}

// lenencString reads a length-encoded string at the start of b.
func lenencString(b []byte) (s []byte, size int, ok bool) {
	v, n, ok := lenenc(b)
	if !ok || uint64(len(b)-n) < v {
		return nil, 0, false
	}
	return b[n : n+int(v)], n + int(v), true
}

// nulString reads a NUL-terminated string at the start of b.
func nulString(b []byte) (s []byte, size int, ok bool) {
	for i, c := range b {
		if c == 0 {
			return b[:i], i + 1, true
		}
	}
	return nil, 0, false
}
