//go:build !linux

package mysqlproto

import (
	"errors"
	"log/slog"
)

// backendWatch is Linux-only (epoll). Elsewhere a close by the backend of
// an idle session is seen when the client's next statement is forwarded.
type backendWatch struct{}

func newBackendWatch(*slog.Logger) (*backendWatch, error) {
	return nil, errors.New("mysqlproto: watching idle backend connections needs Linux")
}

func (*backendWatch) add(*session)  {}
func (*backendWatch) remove(uint64) {}
func (*backendWatch) run()          {}
func (*backendWatch) close()        {}
