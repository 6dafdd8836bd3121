package ru

import (
	"fmt"
	"time"
)

// Class is what a statement costs as, decided by the caller's cheap
// classification. The zero value is ClassRead, so a statement that nobody
// classified is still charged. It is the proxy's one statement class:
// sqlscan names it as the class of a text (read, write, other, free) and
// the wire and the metrics use it; ru imports nothing, so all can share it.
type Class uint8

const (
	// ClassRead is SELECT, SHOW and the like: base cost in RRU.
	ClassRead Class = iota
	// ClassWrite is INSERT, UPDATE, DELETE, REPLACE, LOAD DATA, DDL, COMMIT,
	// and a multi-statement with any write part: base and byte cost in WRU.
	ClassWrite
	// ClassOther is BEGIN, SET, USE, PREPARE and the like: charged as a read.
	ClassOther
	// ClassFetch is COM_STMT_FETCH: it pays only for the bytes it reads.
	ClassFetch
	// ClassFree is COM_PING, COM_QUIT, COM_STMT_CLOSE, COM_STMT_RESET and
	// rgproxy's own admin statements: nothing at all.
	ClassFree
)

// String returns the lower-case class name, fit for a log or a label.
func (c Class) String() string {
	switch c {
	case ClassRead:
		return "read"
	case ClassWrite:
		return "write"
	case ClassOther:
		return "other"
	case ClassFetch:
		return "fetch"
	case ClassFree:
		return "free"
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// RequestInfo is what is known before a statement is forwarded.
type RequestInfo struct {
	// Class decides which costs apply. An unknown value costs as ClassOther.
	Class Class
	// WriteBytes is the write payload known up front (the first packet: query
	// text or bound parameters). It counts only for ClassWrite. Negative
	// values count as 0.
	WriteBytes int64
}

// ResponseInfo is what was measured once the statement's final packet came.
type ResponseInfo struct {
	// ReadBytes is the result bytes the backend returned. Negative values
	// count as 0.
	ReadBytes int64
	// WriteBytes is write payload that streamed after forwarding (LOAD DATA
	// LOCAL INFILE data, long data). It counts only for a ClassWrite
	// statement that succeeded. Negative values count as 0.
	WriteBytes int64
	// BackendTime runs from forwarding the statement to its final packet,
	// less time blocked writing to a slow client. Negative values count as 0.
	BackendTime time.Duration
	// CPUTime is the CPU time the backend thread serving the session spent
	// on the statement, where the caller could measure it (CPUKnown);
	// then it, not BackendTime, is the statement's CPU cost. Negative
	// values count as 0.
	CPUTime  time.Duration
	CPUKnown bool
	// Failed is true when the backend answered with an error.
	Failed bool
}

// BeforeCost is the charge taken before forwarding: the base cost (RRU for
// read and other, WRU for write) and the write bytes known up front. Every
// class but ClassFree counts one statement; ClassFetch pays nothing yet.
func (c Config) BeforeCost(req RequestInfo) Consumption {
	switch req.Class {
	case ClassFree:
		return Consumption{}
	case ClassFetch:
		return Consumption{Statements: 1}
	case ClassWrite:
		wb := float64(max(req.WriteBytes, 0))
		return Consumption{
			WRU:        c.WriteBaseCost + c.WritePerRequestBaseCost + c.WriteCostPerByte*wb,
			WriteBytes: wb,
			Statements: 1,
		}
	default: // ClassRead, ClassOther and unknown values
		return Consumption{
			RRU:        c.ReadBaseCost + c.ReadPerRequestBaseCost,
			Statements: 1,
		}
	}
}

// AfterCost is the charge taken after the final packet: read bytes and
// CPU in RRU (ClassFetch pays only read bytes), where CPU is the backend
// thread's CPU time when known, else the backend time; plus, for a write,
// the bytes that streamed after forwarding in WRU. A failed write is charged
// no streamed bytes and gets back the byte cost BeforeCost charged, as a
// negative WRU and negative WriteBytes; its base cost stays, since the
// backend did the work of refusing it.
func (c Config) AfterCost(req RequestInfo, res ResponseInfo) Consumption {
	if req.Class == ClassFree {
		return Consumption{}
	}
	rb := float64(max(res.ReadBytes, 0))
	out := Consumption{RRU: c.ReadCostPerByte * rb, ReadBytes: rb}
	if req.Class == ClassFetch {
		return out
	}
	bt := max(res.BackendTime, 0)
	cpu := bt
	if res.CPUKnown {
		cpu = max(res.CPUTime, 0)
		out.CPUSeconds = cpu.Seconds()
	}
	// Dividing the integer nanoseconds keeps whole milliseconds exact.
	out.RRU += c.CPUMsCost * (float64(cpu) / float64(time.Millisecond))
	out.BackendSeconds = bt.Seconds()
	if req.Class != ClassWrite {
		return out
	}
	if res.Failed {
		refund := float64(max(req.WriteBytes, 0))
		out.WRU = -c.WriteCostPerByte * refund
		out.WriteBytes = -refund
		return out
	}
	wb := float64(max(res.WriteBytes, 0))
	out.WRU = c.WriteCostPerByte * wb
	out.WriteBytes = wb
	return out
}

// Cost is a statement's whole charge, BeforeCost plus AfterCost.
func (c Config) Cost(req RequestInfo, res ResponseInfo) Consumption {
	total := c.BeforeCost(req)
	total.Add(c.AfterCost(req, res))
	return total
}
