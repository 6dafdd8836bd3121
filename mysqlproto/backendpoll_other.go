//go:build !linux

package mysqlproto

import (
	"errors"
	"log/slog"
)

// backendPoller is Linux-only (epoll). Elsewhere a close by the backend of
// an idle session is seen when the client's next statement is forwarded.
type backendPoller struct{}

func newBackendPoller(*slog.Logger) (*backendPoller, error) {
	return nil, errors.New("mysqlproto: polling idle backend connections needs Linux")
}

func (*backendPoller) add(*session)  {}
func (*backendPoller) remove(uint64) {}
func (*backendPoller) run()          {}
func (*backendPoller) close()        {}
