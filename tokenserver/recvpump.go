package tokenserver

import "context"

// recvPump reads a stream's messages on a goroutine of its own and hands
// them over one at a time, so that a handler can wait for the next
// message and for something else at once (its context, a revocation, a
// timer). The goroutine ends when recv fails, which gRPC makes happen at
// the latest when the handler returns and the stream ends; it never
// blocks on a message nobody takes once ctx is done. The RPC owns it.
func recvPump[T any](ctx context.Context, recv func() (T, error)) (<-chan T, <-chan error) {
	msgs := make(chan T)
	errs := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return msgs, errs
}
