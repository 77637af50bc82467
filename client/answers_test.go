package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A client reuses its connection after an answer too large to arrive in
// one read (a big UTXO transaction, a dequeued message of a megabyte):
// closing such an answer before its last bytes were read would drop the
// connection, and every next call would pay for a new TCP and TLS
// handshake.
func TestLargeAnswersKeepTheConnection(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	var dials atomic.Int64
	d := &net.Dialer{Timeout: 5 * time.Second}
	h := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}}}
	c, err := client.New(srv.URL(), client.WithHTTPClient(h), client.WithBundle(testutil.ClientBundle(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	tx := testutil.UTXOTx("big", 500, 5)
	if _, err := c.UTXOCreate(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: "big"}, make([]byte, 512<<10)); err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"a large UTXO read", func() error { _, err := c.UTXOGet(ctx, tx.TxID, false); return err }},
		{"a dequeue of a large message", func() error {
			d, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "big", Owner: "o"})
			if err == nil {
				t.Cleanup(func() { _ = d.Ack(context.Background()) })
			}
			return err
		}},
	}
	for _, cl := range calls {
		if err := cl.call(); err != nil {
			t.Fatalf("%s: %v", cl.name, err)
		}
		before := dials.Load()
		if _, err := c.QueueStats(ctx, "", "big", false); err != nil {
			t.Fatal(err)
		}
		if n := dials.Load() - before; n != 0 {
			t.Errorf("the call after %s opened %d new connection(s), want the idle one reused", cl.name, n)
		}
	}
}

// An idempotent call whose answer breaks off after its headers (the
// connection reset, a proxy cut short) is resent, as it would be had the
// connection failed before the headers: resending it is safe.
func TestAnIdempotentCallWhoseAnswerBreaksOffIsResent(t *testing.T) {
	ts, n := breaksOffFirst(t, `{"acked":`, http.StatusOK, `{"acked":true}`)
	c, err := client.New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Ack(testCtx(t), wire.AckRequest{Queue: "q", MessageID: "m", LeaseID: "l"})
	if err != nil || !out.Acked || n.Load() != 2 {
		t.Fatalf("an ack whose first answer broke off: %+v, %v after %d requests; want acked after 2", out, err, n.Load())
	}
}

// breaksOffFirst is a server whose first answer breaks off after start
// (see breakOff) and whose next ones are status with body; n counts the
// requests.
func breaksOffFirst(t *testing.T, start string, status int, body string) (ts *httptest.Server, n *atomic.Int64) {
	n = new(atomic.Int64)
	ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			breakOff(t, w, start)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(ts.Close)
	return ts, n
}

// breakOff answers 200 with a JSON body of 100 bytes, sends only start of
// it and closes the connection.
func breakOff(t *testing.T, w http.ResponseWriter, start string) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + start)
	_ = buf.Flush()
	conn.Close()
}

// A call that is not idempotent is not resent when its answer breaks off:
// the server applied it.
func TestACallWhoseAnswerBreaksOffIsNotResentUnlessIdempotent(t *testing.T) {
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		breakOff(t, w, `{"new_version":`)
	}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Update(testCtx(t), client.LeaseRef{Key: "k", LeaseID: "l", TxnID: "t"}, []byte(`{}`), client.Conditions{})
	if err == nil || n.Load() != 1 {
		t.Fatalf("an update whose answer broke off: %v after %d requests; want its failure after 1", err, n.Load())
	}
}

// An error page of a proxy or load balancer in front of the servers (502,
// 503, 504 without raftlockd's envelope: no server was reached, or the
// answer is unknown) is retried for an idempotent call, as the server's own
// unavailable answer is.
func TestAnIdempotentCallIsRetriedAfterAProxysErrorPage(t *testing.T) {
	for _, status := range []int{http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		var n atomic.Int64
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) == 1 {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(status)
				_, _ = w.Write([]byte("<html><body><h1>" + http.StatusText(status) + "</h1></body></html>"))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"namespace":"default","key":"k","version":3}`))
		}))
		c, err := client.New(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.Describe(testCtx(t), "", "k")
		if err != nil || out.Version != 3 {
			t.Errorf("a describe answered %d by a proxy first: %+v, %v after %d requests", status, out, err, n.Load())
		}
		// Not idempotent: not resent, and the status is in the error.
		n.Store(0)
		_, err = c.EnqueueWithKey(testCtx(t), wire.EnqueueRequest{Queue: "q"}, nil, "")
		var e *client.Error
		if !errors.As(err, &e) || e.Status != status || n.Load() != 1 {
			t.Errorf("a keyless enqueue answered %d by a proxy: %v after %d requests; want that error after 1", status, err, n.Load())
		}
		if errors.Is(err, errcode.Unavailable) {
			t.Errorf("a proxy's %d reads as raftlockd's unavailable", status)
		}
		ts.Close()
	}
}

// A remove-peer resent after an attempt whose answer was lost finds the
// server gone: the earlier attempt removed it, which is the answer. A
// first attempt that reached no server proves nothing of the kind.
func TestARemovePeerResentAfterALostAnswerIsDone(t *testing.T) {
	ts, _ := breaksOffFirst(t, `{"removed":`, http.StatusNotFound, `{"error":"not_found","detail":"server n3 is not a member"}`)
	c, err := client.New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.RemovePeer(testCtx(t), "n3")
	if err != nil || !out.Removed || out.ID != "n3" {
		t.Fatalf("remove-peer resent after a lost answer: %+v, %v; want removed", out, err)
	}
	// Not a member, after an attempt that reached no server: not_found.
	c, err = client.New(testutil.FreeAddr(t) + "," + ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemovePeer(testCtx(t), "n3"); !errors.Is(err, errcode.NotFound) {
		t.Fatalf("remove-peer of a server that is no member: %v, want not_found", err)
	}
}
