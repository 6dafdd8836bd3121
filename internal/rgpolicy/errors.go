package rgpolicy

import (
	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// The MySQL errors rgpolicy answers with, by their go-mysql names; TiDB's
// codes for what a resource group stops (8252, 8253, 8254) are
// resourcegroup's (CodeThrottled, CodeRunawayKilled, CodeQuarantined).

// rgproxyError is 1105 (ER_UNKNOWN_ERROR) with one of rgproxy's own
// texts: the one way rgpolicy writes such an error.
func rgproxyError(msg string) *mysqlproto.Error {
	return &mysqlproto.Error{Code: mysql.ER_UNKNOWN_ERROR, State: "HY000", Message: msg}
}

// errInterrupted answers a statement whose session ended while it waited.
var errInterrupted = &mysqlproto.Error{Code: mysql.ER_QUERY_INTERRUPTED, State: "70100", Message: "Query execution was interrupted"}

// errRunawayKilled tells the client its statement was killed by a
// QUERY_LIMIT (TiDB's 8253), instead of the backend's 1317.
var errRunawayKilled = &mysqlproto.Error{Code: resourcegroup.CodeRunawayKilled, State: "HY000",
	Message: "Query execution was interrupted, identified as runaway query"}

// errQuarantined answers a statement that matches a KILL watch: it never
// reaches the backend (TiDB's 8254).
var errQuarantined = &mysqlproto.Error{Code: resourcegroup.CodeQuarantined, State: "HY000",
	Message: "Quarantined and interrupted because of being in runaway watch list"}
