package mysqlproto

import (
	"errors"
	"fmt"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// errQueryAttributes means a COM_QUERY's query-attribute block cannot be
// read; the client gets ER_MALFORMED_PACKET and the session goes on.
var errQueryAttributes = errors.New("mysqlproto: malformed query attributes")

// queryAttributesLen returns the length of the query-attribute block at
// the start of a COM_QUERY payload (after the command byte) when
// CLIENT_QUERY_ATTRIBUTES is in force (MySQL 8.0.23+):
//
//	lenenc parameter_count
//	lenenc parameter_set_count (always 1)
//	if parameter_count > 0:
//	  null bitmap, (parameter_count + 7) / 8 bytes
//	  new_params_bind_flag (1)
//	  per parameter: type (2 bytes), name (lenenc string)
//	  per non-NULL parameter: its value in the binary protocol
//
// The SQL text follows the block.
func queryAttributesLen(b []byte) (int, error) {
	count, k, ok := lenenc(b)
	if !ok {
		return 0, fmt.Errorf("%w: parameter count", errQueryAttributes)
	}
	i := k
	sets, k, ok := lenenc(b[i:])
	if !ok || sets != 1 {
		return 0, fmt.Errorf("%w: parameter set count", errQueryAttributes)
	}
	i += k
	if count == 0 {
		return i, nil
	}
	// Each parameter takes at least 3 bytes (type and an empty name).
	if count > uint64(len(b)) {
		return 0, fmt.Errorf("%w: %d parameters in %d bytes", errQueryAttributes, count, len(b))
	}
	n := int(count)
	nullLen := (n + 7) / 8
	if len(b) < i+nullLen+1 {
		return 0, fmt.Errorf("%w: null bitmap", errQueryAttributes)
	}
	nulls := b[i : i+nullLen]
	i += nullLen
	if b[i] != 1 {
		// Without types the values cannot be measured; MySQL requires them.
		return 0, fmt.Errorf("%w: parameters without types", errQueryAttributes)
	}
	i++
	types := i
	for range n {
		if len(b) < i+2 {
			return 0, fmt.Errorf("%w: parameter type", errQueryAttributes)
		}
		i += 2
		if _, k, ok = lenencString(b[i:]); !ok {
			return 0, fmt.Errorf("%w: parameter name", errQueryAttributes)
		}
		i += k
	}
	for p := range n {
		// The types were checked above: walk them again.
		t := b[types]
		types += 2
		_, k, _ = lenencString(b[types:])
		types += k
		if nulls[p/8]&(1<<(p%8)) != 0 {
			continue
		}
		size, err := binaryValueLen(t, b[i:])
		if err != nil {
			return 0, err
		}
		i += size
	}
	return i, nil
}

// binaryValueLen returns the length of a binary-protocol value of type t
// at the start of b.
func binaryValueLen(t byte, b []byte) (int, error) {
	size := 0
	switch t {
	case mysql.MYSQL_TYPE_NULL:
	case mysql.MYSQL_TYPE_TINY:
		size = 1
	case mysql.MYSQL_TYPE_SHORT, mysql.MYSQL_TYPE_YEAR:
		size = 2
	case mysql.MYSQL_TYPE_LONG, mysql.MYSQL_TYPE_INT24, mysql.MYSQL_TYPE_FLOAT:
		size = 4
	case mysql.MYSQL_TYPE_LONGLONG, mysql.MYSQL_TYPE_DOUBLE:
		size = 8
	case mysql.MYSQL_TYPE_DATE, mysql.MYSQL_TYPE_DATETIME, mysql.MYSQL_TYPE_TIMESTAMP, mysql.MYSQL_TYPE_TIME:
		if len(b) == 0 {
			return 0, fmt.Errorf("%w: temporal value", errQueryAttributes)
		}
		size = 1 + int(b[0])
	case mysql.MYSQL_TYPE_DECIMAL, mysql.MYSQL_TYPE_NEWDECIMAL, mysql.MYSQL_TYPE_VARCHAR, mysql.MYSQL_TYPE_BIT,
		mysql.MYSQL_TYPE_JSON, mysql.MYSQL_TYPE_ENUM, mysql.MYSQL_TYPE_SET, mysql.MYSQL_TYPE_TINY_BLOB,
		mysql.MYSQL_TYPE_MEDIUM_BLOB, mysql.MYSQL_TYPE_LONG_BLOB, mysql.MYSQL_TYPE_BLOB,
		mysql.MYSQL_TYPE_VAR_STRING, mysql.MYSQL_TYPE_STRING, mysql.MYSQL_TYPE_GEOMETRY:
		_, k, ok := lenencString(b)
		if !ok {
			return 0, fmt.Errorf("%w: string value", errQueryAttributes)
		}
		return k, nil
	default:
		return 0, fmt.Errorf("%w: parameter type %d", errQueryAttributes, t)
	}
	if len(b) < size {
		return 0, fmt.Errorf("%w: value of type %d", errQueryAttributes, t)
	}
	return size, nil
}
