package server

import (
	"errors"
	"net/http"

	"github.com/raftlockd/raftlockd/errcode"
)

// Crash stops the server the way a killed process stops, as far as its
// clients can tell: the listener and every client connection are closed at
// once and no request in flight gets an answer (Close, by contrast, stops
// accepting, tells waiting requests to retry elsewhere and lets the others
// finish). The rest is then torn down so that nothing of the node keeps
// running in the process; a caller that wants peers to see no goodbye at
// all cuts the node's network first. Tests use it to model crashes. Later
// calls to Crash or Close return the first call's result.
func (s *Server) Crash() error {
	s.closeOnce.Do(func() {
		err := s.http.Close()
		// The clients are gone; this only ends the handlers still running.
		e := errcode.ShuttingDown.With("node crashed")
		s.drain(e)
		if serr := <-s.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
		if nerr := s.stopNode(); nerr != nil && err == nil {
			err = nerr
		}
		s.closeErr = err
		close(s.done)
	})
	return s.closeErr
}
