package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// A bundle given with an HTTP client that leaves its Transport to Go's
// default (as one set only for its Timeout does) is still presented,
// whether it comes after that client or before it.
func TestBundleAppliesToAnHTTPClientWithTheDefaultTransport(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	h, b := client.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}), client.WithBundle(testutil.ClientBundle(t))
	for name, opts := range map[string][]client.Option{"after": {h, b}, "before": {b, h}} {
		c, err := client.New(srv.URL(), append([]client.Option{client.WithRetry(0)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Describe(ctx, "", "k"); err != nil {
			t.Fatalf("describe with the bundle given %s the HTTP client: %v", name, err)
		}
	}
}

// A keepalive of less than a second extends the lease by a second, not by
// the lease's own (here much longer) TTL, which is what a ttl of 0 asks for.
func TestKeepAliveOfLessThanASecondExtendsByASecond(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	c := testutil.Client(t, srv.URL(), client.WithRetry(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "o", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Unix()
	out, err := l.KeepAlive(ctx, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if late := out.ExpiresAt - before; late > 2 {
		t.Fatalf("a keepalive of 500ms made the lease expire %ds from now, want about 1s", late)
	}
}

// An acquire without an idempotency key sends no X-Idempotency-Key header
// (Go's transport would replay a request carrying one, even empty) and is
// not resent after an ambiguous failure: resent, it would be a second
// acquire. With a key it is resent, under that key.
func TestAKeylessAcquireIsNotResent(t *testing.T) {
	s := &utxoServer{answer: func(_ *http.Request, n int) (int, any) {
		if n <= 2 {
			return http.StatusServiceUnavailable, errcode.Error{Code: errcode.Unavailable.Code, RetryAfter: 1}
		}
		return http.StatusOK, wire.AcquireResponse{Key: "k", LeaseID: "l", FencingToken: 1}
	}}
	c := newUTXOClient(t, s, client.WithRetry(5*time.Second))
	ctx := testCtx(t)
	if _, err := c.AcquireWithKey(ctx, wire.AcquireRequest{Key: "k", Owner: "o"}, ""); !errors.Is(err, errcode.Unavailable) || s.requests() != 1 {
		t.Fatalf("keyless acquire: %v after %d requests, want unavailable after 1", err, s.requests())
	}
	if r, _ := s.request(0); len(r.Header.Values(wire.HeaderIdempotencyKey)) != 0 {
		t.Fatalf("a keyless acquire sent %s %q", wire.HeaderIdempotencyKey, r.Header.Values(wire.HeaderIdempotencyKey))
	}
	if _, err := c.AcquireWithKey(ctx, wire.AcquireRequest{Key: "k", Owner: "o"}, "key-1"); err != nil || s.requests() != 3 {
		t.Fatalf("acquire with a key: %v after %d requests, want success after 3", err, s.requests())
	}
	for n := 1; n <= 2; n++ {
		if r, _ := s.request(n); r.Header.Get(wire.HeaderIdempotencyKey) != "key-1" {
			t.Fatalf("attempt %d sent %s %q", n, wire.HeaderIdempotencyKey, r.Header.Get(wire.HeaderIdempotencyKey))
		}
	}
}

// A call keeps its retries for the retry period after its first failure,
// however long its first attempt waited on the server (an acquire waiting
// its turn, a long-polling dequeue).
func TestRetriesCountFromTheFirstFailure(t *testing.T) {
	s := &utxoServer{answer: func(_ *http.Request, n int) (int, any) {
		if n == 1 {
			time.Sleep(400 * time.Millisecond) // an attempt that waited on the server
			return http.StatusServiceUnavailable, errcode.Error{Code: errcode.NoLeader.Code, RetryAfter: 1}
		}
		return http.StatusOK, wire.DescribeResponse{Key: "k"}
	}}
	c := newUTXOClient(t, s, client.WithRetry(300*time.Millisecond))
	if _, err := c.Describe(testCtx(t), "", "k"); err != nil || s.requests() != 2 {
		t.Fatalf("describe: %v after %d requests, want success after 2", err, s.requests())
	}
}

// A keepalive's ttl is sent in whole seconds: rounded up when positive, 0
// (the lease's own TTL) for 0, and negative (the server's default) for any
// negative ttl, a fraction of a second included.
func TestKeepAliveSendsItsTTL(t *testing.T) {
	s := &utxoServer{answer: func(*http.Request, int) (int, any) { return http.StatusOK, wire.KeepAliveResponse{} }}
	c := newUTXOClient(t, s, client.WithRetry(0))
	ctx := testCtx(t)
	for i, c2 := range []struct {
		ttl  time.Duration
		want int64
	}{{1500 * time.Millisecond, 2}, {0, 0}, {-500 * time.Millisecond, -1}, {-time.Hour, -1}} {
		if _, err := c.KeepAlive(ctx, client.LeaseRef{Key: "k", LeaseID: "l"}, c2.ttl); err != nil {
			t.Fatal(err)
		}
		_, body := s.request(i)
		var req wire.KeepAliveRequest
		if err := json.Unmarshal([]byte(body), &req); err != nil || (req.TTLSeconds < 0) != (c2.want < 0) || c2.want >= 0 && req.TTLSeconds != c2.want {
			t.Errorf("ttl %v sent ttl_seconds %d (%v), want %d", c2.ttl, req.TTLSeconds, err, c2.want)
		}
	}
}

// roundTripper is an HTTP transport that is not an *http.Transport (as a
// tracing wrapper is).
type roundTripper struct{}

func (roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	return http.DefaultTransport.RoundTrip(r)
}

// TLS settings that cannot reach the HTTP client's transport are an error,
// not silently dropped (the client would present no certificate and trust
// the system's CAs instead of the cluster's).
func TestTLSThatCannotTakeEffectIsAnError(t *testing.T) {
	_, err := client.New("https://127.0.0.1:1", client.WithHTTPClient(&http.Client{Transport: roundTripper{}}),
		client.WithTLS(&tls.Config{MinVersion: tls.VersionTLS13}))
	if err == nil {
		t.Fatal("WithTLS on a transport it cannot configure was accepted")
	}
}

// connCounter is an httptest server that counts the connections made to it.
func connCounter(t *testing.T, tlsOn bool) (url string, conns *atomic.Int32) {
	t.Helper()
	conns = &atomic.Int32{}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if tlsOn {
		ts.StartTLS()
	} else {
		ts.Start()
	}
	t.Cleanup(ts.Close)
	return strings.Replace(ts.URL, "http://", "https://", 1), conns
}

// A TLS failure that trying again cannot mend (a server certificate of a
// CA the client does not trust, a server refusing the client's
// certificate, a server that does not speak TLS) is reported at once, not
// after the retry period.
func TestTLSRefusalsAreNotRetried(t *testing.T) {
	ctx := testCtx(t)
	for name, tlsOn := range map[string]bool{"a CA the client does not trust": true, "no TLS": false} {
		url, conns := connCounter(t, tlsOn)
		c, err := client.New(url, client.WithRetry(30*time.Second), client.WithBundle(testutil.ClientBundle(t)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Describe(ctx, "", "k"); err == nil || conns.Load() != 1 {
			t.Fatalf("%s: %v after %d connections, want a failure after 1", name, err, conns.Load())
		}
	}
	// The server refuses the client's certificate: another CA's.
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	other, err := auth.NewCA(auth.IssueOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	stranger := testutil.Issue(t, other, auth.RoleClient, auth.IssueOptions{Name: "stranger"})
	cfg := auth.ClientConfig(testutil.ClientBundle(t))
	cfg.Certificates = []tls.Certificate{stranger.TLSCertificate()}
	c, err := client.New(srv.URL(), client.WithRetry(30*time.Second), client.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Describe(ctx, "", "k"); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("a refused client certificate: %v after %v, want a failure at once", err, time.Since(start))
	}
	// A TLS server that wants a client certificate and got none says so
	// with an alert.
	var conns atomic.Int32
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	c, err = client.New(ts.URL, client.WithRetry(30*time.Second), client.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Describe(ctx, "", "k"); err == nil || conns.Load() != 1 {
		t.Fatalf("a TLS alert: %v after %d connections, want a failure after 1", err, conns.Load())
	}
}
