package api_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A consumer that goes away while its delivery is being written (the
// server blocked on a payload the consumer stopped reading) did not get the
// delivery: the server hands it back at once, without spending an attempt,
// instead of leaving it leased to nobody until its lease runs out.
func TestADeliveryWhoseWritingFailsIsHandedBack(t *testing.T) {
	e := newEnvWith(t, func(c *config.Server) { c.MaxPayloadBytes = 16 << 20 })
	ctx := testCtx(t)
	if _, err := e.client().Enqueue(ctx, wire.EnqueueRequest{Queue: "big"}, bytes.Repeat([]byte("x"), 12<<20)); err != nil {
		t.Fatal(err)
	}
	// A consumer with a small receive buffer, which reads the answer's
	// headers and leaves: the server cannot have written the payload.
	tr := e.hc.Transport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}).DialContext
	defer tr.CloseIdleConnections()
	rctx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, e.url+"/v1/queue/dequeue",
		strings.NewReader(`{"queue":"big","owner":"gone","wait_seconds":-1,"visibility_timeout_seconds":600}`))
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("dequeue: %d", res.StatusCode)
	}
	cancel()
	res.Body.Close()
	testutil.WaitFor(t, 10*time.Second, "the delivery to be handed back", func() bool { return e.stats("big").Ready == 1 })
	d := e.dequeueOne("big")
	if m := d.meta.Message; m.Attempts != 2 || m.FailureAttempts != 0 || len(d.payload) != 12<<20 {
		t.Fatalf("the delivery after the hand-back: %+v, %d bytes", m, len(d.payload))
	}
}
