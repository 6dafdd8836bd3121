//go:build !unix

package mysqlproto

// nofileLimit: no descriptor limit is known here.
func nofileLimit() (uint64, bool) { return 0, false }
