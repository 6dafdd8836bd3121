// Package sqlscan is where rgproxy reads a statement's SQL text: one pass
// of sqltext's lexer, in the session's character set and sql_mode, yields
// everything the proxy needs from the text (its class, the statements of a
// multi-statement, the digest and its hash, hints and tag comments, what it
// does to character_set_client, the words a policy asked about). The wire
// package (mysqlproto) carries the result in its Statement; the policy
// reads the result and never lexes the text itself.
//
// Every reader here takes a Mode: reading a text in a mode other than the
// session's ends strings and identifiers where the server does not, which
// is how a second reading comes to disagree with the first.
package sqlscan

import (
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqltext"
)

// Class is a statement's cost class. It is the cost model's own type
// (package ru imports nothing, so both the wire and the meter can share
// it): the text decides read, write, other or free; fetch is a command's.
type Class = ru.Class

// The classes a statement's text may have.
const (
	ClassFree  = ru.ClassFree
	ClassRead  = ru.ClassRead
	ClassWrite = ru.ClassWrite
	ClassOther = ru.ClassOther
)

// Mode is how the server reads a text: the session's character set and
// whether its sql_mode has NO_BACKSLASH_ESCAPES.
type Mode = sqltext.Mode

// Charset is the family of a character_set_client, as far as reading SQL
// text is concerned.
type Charset = sqltext.Charset

// The character-set families that read differently.
const (
	ASCIISafe = sqltext.ASCIISafe
	GBK       = sqltext.GBK
	Big5      = sqltext.Big5
	SJIS      = sqltext.SJIS
	GB18030   = sqltext.GB18030
)

// CharsetByName returns the family of a character set or collation name.
func CharsetByName(name string) Charset { return sqltext.CharsetByName(name) }

// CharsetByCollationID returns the family of a collation id (a handshake's
// or COM_CHANGE_USER's), and whether the id is known.
func CharsetByCollationID(id uint16) (cs Charset, known bool) {
	return sqltext.CharsetByCollationID(id)
}
