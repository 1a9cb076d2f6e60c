package platform

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// ServeFrontDoor serves h on a free loopback port the way StartTier2
// serves its front door (frontDoorServer, abort at the drain's deadline),
// draining for at most drainAfter (zero: drainTimeout) once ctx ends. It
// returns the address, serve's result, and a func that closes the server
// at once.
func ServeFrontDoor(ctx context.Context, h http.Handler, abort func(), drainAfter time.Duration, log *slog.Logger) (addr string, served <-chan error, closeNow func(), err error) {
	s, err := listen("tier2", "127.0.0.1:0", h)
	if err != nil {
		return "", nil, nil, err
	}
	frontDoorServer(s, abort)
	s.drainAfter = drainAfter
	done := make(chan error, 1)
	go func() { done <- s.serve(ctx, log) }()
	return s.Addr(), done, func() { s.srv.Close() }, nil
}
