package mysqlproto

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
)

func TestWriteReadMessage(t *testing.T) {
	tests := []struct {
		name    string
		size    int
		packets int
	}{
		{"empty", 0, 1},
		{"small", 10, 1},
		{"just below a chunk", mysql.MaxPayloadLen - 1, 1},
		{"exactly a chunk", mysql.MaxPayloadLen, 2}, // followed by an empty packet
		{"two chunks and a bit", 2*mysql.MaxPayloadLen + 5, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := make([]byte, tt.size)
			for i := range payload {
				payload[i] = byte(i)
			}
			var buf bytes.Buffer
			bw := bufio.NewWriter(&buf)
			next, err := writeMessage(bw, 3, payload)
			if err != nil || bw.Flush() != nil {
				t.Fatal(err)
			}
			if int(next-3) != tt.packets {
				t.Fatalf("%d packets, want %d", next-3, tt.packets)
			}
			if buf.Len() != tt.size+4*tt.packets {
				t.Fatalf("%d bytes on the wire", buf.Len())
			}
			got, seq, err := readMessage(bufio.NewReader(&buf), nil, 1<<30)
			if err != nil || !bytes.Equal(got, payload) || seq != next-1 {
				t.Fatalf("read back %d bytes seq %d err %v", len(got), seq, err)
			}
		})
	}
}

func TestReadMessageErrors(t *testing.T) {
	tests := []struct {
		name  string
		wire  []byte
		limit int64
		want  error
	}{
		{"truncated header", []byte{5, 0}, 100, io.ErrUnexpectedEOF},
		{"truncated payload", []byte{5, 0, 0, 0, 'a'}, 100, io.ErrUnexpectedEOF},
		{"too large", []byte{5, 0, 0, 0, 'a', 'b', 'c', 'd', 'e'}, 4, ErrPacketTooLarge},
		{"nothing", nil, 100, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := readMessage(bufio.NewReader(bytes.NewReader(tt.wire)), nil, tt.limit)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestLenenc(t *testing.T) {
	for _, v := range []uint64{0, 1, 250, 251, 65535, 65536, 1<<24 - 1, 1 << 24, 1<<64 - 1} {
		b := appendLenenc(nil, v)
		got, n, ok := lenenc(b)
		if !ok || got != v || n != len(b) {
			t.Errorf("%d: got %d size %d ok %v", v, got, n, ok)
		}
		if _, _, ok := lenenc(b[:len(b)-1]); ok && len(b) > 1 {
			t.Errorf("%d: truncated value accepted", v)
		}
	}
	for _, b := range [][]byte{nil, {0xfb}, {0xff}} {
		if _, _, ok := lenenc(b); ok {
			t.Errorf("%x accepted", b)
		}
	}
}

func TestCopyN(t *testing.T) {
	src := bytes.Repeat([]byte("0123456789"), 10000)
	for _, tc := range []struct {
		name          string
		rsize, wsize  int
		chunk, prefix int
	}{
		{"small writer", 4096, 1000, 1 << 20, 0},
		// A small reader beside a large writer reads into the writer.
		{"large writer", 4096, 16 << 10, 1 << 20, 0},
		{"large writer, trickled", 4096, 16 << 10, 1000, 0},
		{"large writer, reader holding bytes", 4096, 16 << 10, 3000, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(&trickle{avail: src, chunk: tc.chunk}, tc.rsize)
			var dst bytes.Buffer
			bw := bufio.NewWriterSize(&dst, tc.wsize)
			if tc.prefix > 0 {
				if _, err := br.Peek(tc.prefix); err != nil {
					t.Fatal(err)
				}
			}
			if err := copyN(bw, br, 99999); err != nil || bw.Flush() != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst.Bytes(), src[:99999]) {
				t.Fatal("copied bytes differ")
			}
			if err := copyN(bw, br, 2); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("short source: %v", err)
			}
		})
	}
	// A failed write is the writer's error.
	bw := bufio.NewWriterSize(failWriter{}, 16<<10)
	br := bufio.NewReaderSize(bytes.NewReader(src), 4096)
	var werr *writeError
	if err := copyN(bw, br, 99999); !errors.As(err, &werr) {
		t.Fatalf("failing writer: %v", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("backend gone") }

func FuzzReadPacket(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 3}, int64(100))
	f.Add([]byte{0xff, 0xff, 0xff, 0, 1, 2}, int64(1<<24))
	f.Add([]byte{0, 0, 0, 0}, int64(0))
	f.Fuzz(func(t *testing.T, wire []byte, limit int64) {
		br := bufio.NewReader(bytes.NewReader(wire))
		p, _, err := readMessage(br, nil, limit)
		if err == nil && int64(len(p)) > limit {
			t.Fatalf("payload of %d bytes passed limit %d", len(p), limit)
		}
		if err == nil {
			// What was read re-encodes to a prefix of the input.
			var out bytes.Buffer
			bw := bufio.NewWriter(&out)
			seq := wire[3]
			if _, werr := writeMessage(bw, seq, p); werr != nil {
				t.Fatal(werr)
			}
			bw.Flush()
			if len(p) < mysql.MaxPayloadLen && !bytes.HasPrefix(wire, out.Bytes()) {
				t.Fatalf("re-encoded %x is not a prefix of %x", out.Bytes(), wire)
			}
		}
	})
}
