package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

// A subscription that ends (its context) after the server leased it a
// delivery it already read, but before that delivery reached fn, hands the
// delivery back rather than leaving it leased until its lease runs out.
func TestSubscriptionEndingHandsBackADeliveryItReadButDidNotHandOver(t *testing.T) {
	var mu sync.Mutex
	var nacked []wire.NackRequest
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/queue/subscribe":
			// Two deliveries in one write: both reach the client before
			// fn sees the first.
			w.Header().Set("Content-Type", "multipart/related; boundary=b1")
			_, _ = w.Write(deliveryBody(t, "b1", false, "one", "two"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/v1/queue/nack":
			var req wire.NackRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				t.Error(err)
			}
			mu.Lock()
			nacked = append(nacked, req)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"requeued":true}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	err = c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o", PageSize: 2}, func(d *Delivery) error {
		got = append(got, d.Message.MessageID)
		cancel() // the consumer stops after its first message
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("subscription ended with %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != "m0" {
		t.Fatalf("fn got %v", got)
	}
	if len(nacked) != 1 || nacked[0].MessageID != "m1" || nacked[0].Intent != wire.NackIntentDefer || nacked[0].LeaseID != "l" {
		t.Fatalf("handed back %+v, want only m1, deferred", nacked)
	}
}

// nackRecorder serves /v1/queue/nack, recording each nack, and hands
// /v1/queue/subscribe to stream.
type nackRecorder struct {
	t      *testing.T
	mu     sync.Mutex
	nacked []wire.NackRequest
	stream func(w http.ResponseWriter, r *http.Request)
}

func (s *nackRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/queue/subscribe":
		// A handler that read its request's body learns that the client
		// went away (its context ends).
		_, _ = io.Copy(io.Discard, r.Body)
		s.stream(w, r)
	case "/v1/queue/nack":
		var req wire.NackRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			s.t.Error(err)
		}
		s.mu.Lock()
		s.nacked = append(s.nacked, req)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"requeued":true}`))
	default:
		http.NotFound(w, r)
	}
}

// handedBack lists the message ids nacked with intent defer.
func (s *nackRecorder) handedBack() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, n := range s.nacked {
		if n.Intent == wire.NackIntentDefer {
			ids = append(ids, n.MessageID)
		}
	}
	return ids
}

func (s *nackRecorder) client(t *testing.T) *Client {
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	c, err := New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A subscription whose fn fails hands back the deliveries that had arrived
// behind the one fn failed on, instead of leaving them leased until their
// leases run out (which would count as failed deliveries).
func TestASubscriptionWhoseFnFailsHandsBackWhatArrived(t *testing.T) {
	s := &nackRecorder{t: t, stream: openStream(t, "one", "two", "three")}
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	failed := errors.New("the consumer failed")
	err := c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o", PageSize: 3}, func(d *Delivery) error {
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("subscription ended with %v", err)
	}
	if got := s.handedBack(); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("handed back %v, want m1 and m2", got)
	}
}

// A delivery that a broken-off stream brought only in part (its meta part,
// so it is leased to the subscription) is handed back; the subscription
// then opens its stream again.
func TestADeliveryCutShortIsHandedBack(t *testing.T) {
	var opened atomic.Int32
	s := &nackRecorder{t: t}
	s.stream = func(w http.ResponseWriter, r *http.Request) {
		if opened.Add(1) > 1 {
			<-r.Context().Done()
			return
		}
		body := deliveryBody(t, "b1", false, "a payload cut short")
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		// The response so far, then the delivery up to the middle of its
		// payload, and the connection breaks off.
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: multipart/related; boundary=b1\r\n\r\n")
		_, _ = buf.Write(body[:bytes.Index(body, []byte("cut short"))])
		_ = buf.Flush()
	}
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o"}, func(d *Delivery) error {
			t.Errorf("fn got %s, which arrived in part", d.Message.MessageID)
			return nil
		})
	}()
	for deadline := time.Now().Add(5 * time.Second); !slices.Equal(s.handedBack(), []string{"m0"}) || opened.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: handed back %v, stream opened %d times; want m0 handed back and the stream opened again",
				s.handedBack(), opened.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("subscription ended with %v", err)
	}
}

// A heartbeat that extends a delivery may run while another goroutine acks
// it (go test -race checks this).
func TestExtendingWhileAckingIsSafe(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"lease_expires_at_unix":99,"acked":true}`))
	}))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	d := &Delivery{c: c, Message: wire.Message{Namespace: "default", Queue: "q", MessageID: "m", LeaseID: "l", FencingToken: 1}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range 20 {
			if _, err := d.Extend(ctx, time.Second); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 20 {
			if err := d.Ack(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
}

// A server that accepts a connection but never answers its TLS handshake
// (a stopped process) is given up on after the connect timeout.
func TestAStalledHandshakeIsGivenUpOn(t *testing.T) {
	defer func(d time.Duration) { connectTimeout = d }(connectTimeout)
	connectTimeout = 300 * time.Millisecond
	addr := rawServer(t, func(conn net.Conn) { t.Cleanup(func() { conn.Close() }) })
	c, err := New("https://"+addr, WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Describe(ctx, "", "k"); err == nil || ctx.Err() != nil {
		t.Fatalf("describe against a stalled handshake: %v (context: %v), want a handshake timeout", err, ctx.Err())
	}
}

// A server that accepts a connection but never completes its TLS
// handshake (a stopped process) was sent nothing: a call that is not
// resent after an ambiguous failure, such as a keyless acquire, goes on to
// the next server of the list as after a refused connection.
func TestAStalledHandshakeIsPassedOver(t *testing.T) {
	defer func(d time.Duration) { connectTimeout = d }(connectTimeout)
	connectTimeout = 300 * time.Millisecond
	stalled := rawServer(t, func(conn net.Conn) { t.Cleanup(func() { conn.Close() }) })
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"key":"k","owner":"o","lease_id":"l","fencing_token":1}`))
	}))
	t.Cleanup(ts.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	c, err := New("https://"+stalled+","+ts.URL, WithRetry(0), WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.AcquireWithKey(ctx, wire.AcquireRequest{Key: "k", Owner: "o"}, ""); err != nil {
		t.Fatalf("keyless acquire with the first server of the list stalled: %v", err)
	}
}

// A subscription whose context ends while several deliveries wait behind
// the one fn has hands back every one of them, as it does when fn fails,
// not only the next one.
func TestASubscriptionEndingHandsBackEveryDeliveryThatArrived(t *testing.T) {
	s := &nackRecorder{t: t, stream: openStream(t, "one", "two", "three")}
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o", PageSize: 3}, func(d *Delivery) error {
		cancel() // the consumer stops after its first message
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("subscription ended with %v", err)
	}
	if got := s.handedBack(); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("handed back %v, want m1 and m2", got)
	}
}

// openStream is a subscription stream that delivers payloads and then goes
// on, sending nothing more, until the client goes away.
func openStream(t *testing.T, payloads ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "multipart/related; boundary=b1")
		body := deliveryBody(t, "b1", false, payloads...)
		_, _ = w.Write(body[:len(body)-len("\r\n--b1--\r\n")])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
}

// cancelAfterHeaders ends a call's context once its answer's headers have
// arrived (a consumer stopping just as its stream opened).
type cancelAfterHeaders struct {
	base   http.RoundTripper
	cancel context.CancelFunc
}

func (rt *cancelAfterHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := rt.base.RoundTrip(r)
	if err == nil && r.URL.Path == "/v1/queue/subscribe" {
		rt.cancel()
	}
	return resp, err
}

// A subscription whose context ends as its stream opens, when the server
// had already leased it (and sent) the stream's first delivery, hands that
// delivery back instead of leaving it leased until its lease runs out.
func TestASubscriptionEndingAsItsStreamOpensHandsBackWhatArrived(t *testing.T) {
	s := &nackRecorder{t: t, stream: openStream(t, "one")}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ts.URL, WithHTTPClient(&http.Client{Transport: &cancelAfterHeaders{base: http.DefaultTransport, cancel: cancel}}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "o"}, func(d *Delivery) error {
		t.Errorf("fn got %s after the context ended", d.Message.MessageID)
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("subscription ended with %v", err)
	}
	if got := s.handedBack(); !slices.Equal(got, []string{"m0"}) {
		t.Fatalf("handed back %v, want m0", got)
	}
}
