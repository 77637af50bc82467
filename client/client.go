// Package client is raftlockd's Go SDK. It speaks the lockd-compatible v1
// HTTP API (types from package wire), retries what is safe to retry while a
// cluster elects a leader, and gives every acquire an idempotency key so that
// a retry after a lost response returns the lease the first attempt got
// instead of queueing behind it. A call whose context has a deadline sends
// it along (X-Raftlockd-Timeout), so the server gives up when the caller
// does. The CLI and the benchmark tool use it.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// Client talks to a raftlockd cluster through one of its servers' API
// endpoints: the first it was given until that one cannot be reached (or
// is shutting down, or knows no leader), then the next.
type Client struct {
	bases     []string
	cur       atomic.Int64 // index into bases of the server in use
	http      *http.Client
	namespace string
	retryFor  time.Duration
	tls       *tls.Config // WithTLS's, set on the HTTP client's transport once every option is in
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (for TLS settings or timeouts).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithTLS dials the server with cfg (for mTLS: the client certificate to
// present and the CA to check the server against). With WithHTTPClient,
// given before or after it, it applies to a copy of that client's
// *http.Transport, or of Go's default transport when the client names
// none; New fails when that client's transport is of another type, since
// cfg could not take effect.
func WithTLS(cfg *tls.Config) Option { return func(c *Client) { c.tls = cfg } }

// useTLS sets cfg on a copy of the HTTP client's transport.
func (c *Client) useTLS(cfg *tls.Config) error {
	rt := c.http.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	t, ok := rt.(*http.Transport)
	if !ok {
		return fmt.Errorf("client: WithTLS needs the HTTP client's transport to be an *http.Transport, not %T: set TLS on that transport instead", rt)
	}
	t = t.Clone()
	t.TLSClientConfig = cfg
	h := *c.http
	h.Transport = t
	c.http = &h
	return nil
}

// WithBundle presents bundle b's certificate and trusts b's CA: how
// raftlockd's mTLS is used (see `raftlockd auth`).
func WithBundle(b *auth.Bundle) Option { return WithTLS(auth.ClientConfig(b)) }

// WithNamespace sets the namespace used when a call names none.
func WithNamespace(ns string) Option { return func(c *Client) { c.namespace = ns } }

// WithRetry bounds how long a call keeps retrying while the cluster has no
// leader or the connection fails (default 10s; 0 disables retries).
func WithRetry(d time.Duration) Option { return func(c *Client) { c.retryFor = d } }

// New returns a client for baseURL (for example http://127.0.0.1:9341),
// or for several servers of one cluster given as a comma-separated list
// (https://a:9341,https://b:9341,https://c:9341): a call goes to the server
// in use, and when that one cannot be reached, is shutting down or knows
// no leader, the client moves on to the next and tries the call there
// (within what WithRetry allows; a server that cannot be reached costs no
// backoff while another is left to try; a leave of the server in use,
// ClusterLeave or TCLeave without an endpoint, is never passed on). A URL
// without a scheme gets http://.
func New(baseURL string, opts ...Option) (*Client, error) {
	var bases []string
	for _, b := range strings.Split(baseURL, ",") {
		b = strings.TrimSpace(b)
		if !strings.Contains(b, "://") {
			b = "http://" + b
		}
		u, err := url.Parse(b)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("client: bad server URL %q", b)
		}
		bases = append(bases, strings.TrimRight(u.String(), "/"))
	}
	// Connecting is bounded (a server that accepts but never completes the
	// handshake, such as a stopped process, is given up on); waiting for
	// the answer is not, since an acquire or a dequeue may wait on the
	// server as long as it asked to.
	dialer := &net.Dialer{Timeout: connectTimeout, KeepAliveConfig: deadPeer}
	c := &Client{bases: bases, namespace: wire.DefaultNamespace, retryFor: 10 * time.Second,
		http: &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext,
			TLSHandshakeTimeout: connectTimeout, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second,
			ExpectContinueTimeout: time.Second}}}
	for _, o := range opts {
		o(c)
	}
	if c.tls != nil {
		if err := c.useTLS(c.tls); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// connectTimeout bounds a connection's dial and its TLS handshake (a
// variable for tests).
var connectTimeout = 10 * time.Second

// deadPeer gives up a connection whose server vanished without closing it
// (a host powered off, a network cut) after about 30 s of silence: TCP
// keepalive probes start after 15 s idle, and three unanswered 5 s apart
// end it. A subscription or a long wait on the server then fails (and
// reopens or retries) instead of waiting out the system's default, which
// is minutes.
var deadPeer = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// Error is a rejection from the server: the HTTP status and the stable
// error envelope. errors.Is(err, errcode.Waiting) and friends work on it.
type Error struct {
	Status   int
	Envelope *errcode.Error
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Envelope.Error(), e.Status) }
func (e *Error) Unwrap() error { return e.Envelope }

// call is one HTTP exchange.
type call struct {
	method     string
	path       string
	query      url.Values
	header     http.Header
	body       []byte
	idempotent bool // safe to resend after an ambiguous failure
	// pinned is a call that acts on the server serving it (a leave): it
	// is made, and resent, only to the server in use when it started,
	// never passed on to another.
	pinned bool
	// resent, when set, is told whether the call was sent again after an
	// attempt that may have taken effect (it reached a server, which did
	// not answer that it had done nothing).
	resent *bool
}

// retryable reports whether a failed attempt may be resent: always when the
// request never reached a leader, and after ambiguous failures only when the
// call is idempotent. A node that shuts down answers the requests it still
// serves with shutdown_draining, those it was forwarding to the leader
// included, which the leader may have applied: that answer is ambiguous.
func retryable(err error, idempotent bool) bool {
	var e *Error
	if errors.As(err, &e) {
		switch e.Envelope.Code {
		case errcode.NoLeader.Code, errcode.NotLeader.Code:
			return true
		case errcode.Unavailable.Code, errcode.ShuttingDown.Code:
			return idempotent
		}
		// An error page without raftlockd's envelope, from a proxy or load
		// balancer in front of the servers: it may not have reached one,
		// or have lost its answer.
		if proxyError(e) {
			return idempotent
		}
		return false
	}
	if refused(err) {
		return false
	}
	if unreachable(err) {
		return true
	}
	return idempotent && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// proxyError reports whether e is a gateway's failure (502, 503, 504)
// rather than a server's answer, which always carries an envelope.
func proxyError(e *Error) bool {
	switch e.Status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return e.Envelope.Code == "http_"+strconv.Itoa(e.Status)
	}
	return false
}

// refused reports whether err is a TLS failure that trying again cannot
// mend: the server's certificate is not one this client trusts (or names
// another host), the server refused this client's certificate, or the
// server does not speak TLS at all.
func refused(err error) bool {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var alert tls.AlertError
	var op *net.OpError
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) ||
		errors.As(err, &alert) || errors.As(err, &op) && op.Op == "remote error" ||
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

// do makes the call, resending it while retryable allows for up to
// retryFor from its first failure (not from its start: an acquire or a
// dequeue that waited its turn on the server for longer keeps its retries).
// The caller reads and closes the answer.
func (c *Client) do(ctx context.Context, cl call) (*http.Response, error) {
	var resp *http.Response
	err := c.exchange(ctx, cl, func(r *http.Response) error {
		resp = r
		return nil
	})
	return resp, err
}

// doRead is do for an answer that read consumes whole: the answer is read
// within the attempt, so that an idempotent call whose answer breaks off
// after its headers is resent like one whose connection failed before
// them. The answer is closed once read.
func (c *Client) doRead(ctx context.Context, cl call, read func(*http.Response) error) error {
	return c.exchange(ctx, cl, func(resp *http.Response) error {
		defer closeBody(resp)
		if err := read(resp); err != nil {
			if answerCut(err) {
				return &cutAnswer{err}
			}
			return &badAnswer{err}
		}
		return nil
	})
}

// cutAnswer is an answer that broke off; badAnswer one that could not be
// read otherwise (not what the call expects), which no retry mends.
type cutAnswer struct{ err error }

func (e *cutAnswer) Error() string { return e.err.Error() }
func (e *cutAnswer) Unwrap() error { return e.err }

type badAnswer struct{ err error }

func (e *badAnswer) Error() string { return e.err.Error() }
func (e *badAnswer) Unwrap() error { return e.err }

// answerCut reports whether err, the failure to read an answer, is its
// connection failing or the answer ending before its length.
func answerCut(err error) bool {
	var ne net.Error
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// drainBytes bounds what is read of an answer past what its call needed,
// so that its connection can be reused (one closed before the end of its
// answer is dropped).
const drainBytes = 64 << 10

// closeBody closes an answer after reading what is left of it, up to
// drainBytes.
func closeBody(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	resp.Body.Close()
}

func (c *Client) exchange(ctx context.Context, cl call, read func(*http.Response) error) error {
	var deadline time.Time
	backoff := 50 * time.Millisecond
	hops := 0 // servers tried without a pause since the last one
	base := c.endpoint()
	for {
		if !cl.pinned {
			base = c.endpoint()
		}
		resp, err := c.once(ctx, base, cl)
		if err == nil {
			if err = read(resp); err == nil {
				return nil
			}
			var bad *badAnswer
			if errors.As(err, &bad) {
				return bad.err
			}
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(c.retryFor)
		}
		moved := !cl.pinned && c.passOn(base, err) // also for the caller's next call, when this one is not resent
		if !retryable(err, cl.idempotent) {
			return unwrapCut(err)
		}
		if cl.resent != nil && mayHaveApplied(err) {
			*cl.resent = true
		}
		if moved && unreachable(err) && hops < len(c.bases)-1 && ctx.Err() == nil {
			// Nothing reached that server: the next is tried at once.
			hops++
			continue
		}
		hops = 0
		if time.Now().Add(backoff).After(deadline) {
			return unwrapCut(err)
		}
		if err := pause(ctx, backoff, unwrapCut(err)); err != nil {
			return err
		}
		backoff = min(backoff*2, time.Second)
	}
}

// endpoint is the base URL of the server in use.
func (c *Client) endpoint() string {
	return c.bases[int(c.cur.Load()%int64(len(c.bases)))]
}

// passOn moves the client on from server base, in use when a call failed
// with err (a retryable failure), to the next server when the failure is
// that server's: it cannot be reached, is shutting down, knows no leader
// or cannot serve for now. It reports whether another server is there to
// try. Concurrent calls that fail on the same server move on once.
func (c *Client) passOn(base string, err error) bool {
	if len(c.bases) < 2 || !serverFailed(err) {
		return false
	}
	for {
		i := c.cur.Load()
		if c.bases[int(i%int64(len(c.bases)))] != base || c.cur.CompareAndSwap(i, i+1) {
			return true
		}
	}
}

// serverFailed reports whether a retryable failure is the server's own
// rather than the cluster's: another server may serve the call.
func serverFailed(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return serverGoingAway(e) || proxyError(e)
	}
	// The connection failed, unless the server was refused or the caller
	// gave up.
	return !refused(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// serverGoingAway reports whether e is a server's answer that it cannot
// serve for now: it shuts down, knows no leader (or is not one), or is
// unavailable.
func serverGoingAway(e *Error) bool {
	switch e.Envelope.Code {
	case errcode.ShuttingDown.Code, errcode.NoLeader.Code, errcode.NotLeader.Code, errcode.Unavailable.Code:
		return true
	}
	return false
}

// mayHaveApplied reports whether a failed attempt may have taken effect:
// it reached a server, which did not answer that nothing was done.
func mayHaveApplied(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		switch e.Envelope.Code {
		case errcode.NoLeader.Code, errcode.NotLeader.Code:
			return false
		}
	}
	return !unreachable(err)
}

// unreachable reports whether err is a connection to the server that
// could not be made, or whose TLS handshake did not finish within
// connectTimeout (a stopped process accepts connections but never
// answers): the call reached no server.
func unreachable(err error) bool {
	var op *net.OpError
	var ne net.Error
	return errors.As(err, &op) && op.Op == "dial" ||
		errors.As(err, &ne) && ne.Timeout() && strings.HasSuffix(err.Error(), "TLS handshake timeout") // net/http's unexported error
}

// unwrapCut returns the error an answer that broke off failed with.
func unwrapCut(err error) error {
	var cut *cutAnswer
	if errors.As(err, &cut) {
		return cut.err
	}
	return err
}

// pause waits d before the next attempt; when ctx ends first it returns
// that, with last, the failure of the attempt before.
func pause(ctx context.Context, d time.Duration, last error) error {
	if err := sleep(ctx, d); err != nil {
		return fmt.Errorf("client: %w while waiting to retry after: %w", err, last)
	}
	return nil
}

// sleep waits d (nothing when d is not positive), or until ctx ends: then
// it returns why.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Client) once(ctx context.Context, base string, cl call) (*http.Response, error) {
	u := base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var body io.Reader = http.NoBody
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	for k, vs := range cl.header {
		req.Header[k] = vs
	}
	if cl.body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	// The server, and the leader it forwards to, give up when the caller does.
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d).Truncate(time.Millisecond); left > 0 {
			req.Header.Set(wire.HeaderTimeout, min(left, 24*time.Hour).String())
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %s %s: %w", cl.method, cl.path, err)
	}
	return checkStatus(resp)
}

// maxErrorBytes bounds the error envelope read from a response. The
// envelope of a failed UTXO batch lists every failed item, so it may be as
// large as the batch.
const maxErrorBytes = 32 << 20

// checkStatus turns a response of 300 or above into an *Error (closing it).
func checkStatus(resp *http.Response) (*http.Response, error) {
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
		e := &errcode.Error{}
		if json.Unmarshal(raw, e) != nil || e.Code == "" {
			e = &errcode.Error{Code: "http_" + strconv.Itoa(resp.StatusCode), Detail: strings.TrimSpace(string(raw))}
		}
		return nil, &Error{Status: resp.StatusCode, Envelope: e}
	}
	return resp, nil
}

func (c *Client) doJSON(ctx context.Context, cl call, out any) (*http.Response, error) {
	var resp *http.Response
	err := c.doRead(ctx, cl, func(r *http.Response) error {
		resp = r
		if out != nil {
			// Nothing of an earlier attempt's answer that broke off stays.
			if v := reflect.ValueOf(out); v.Kind() == reflect.Pointer && !v.IsNil() {
				v.Elem().SetZero()
			}
			if err := json.NewDecoder(r.Body).Decode(out); err != nil {
				return fmt.Errorf("client: decode %s response: %w", cl.path, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (c *Client) ns(ns string) string {
	if ns == "" {
		return c.namespace
	}
	return ns
}

// Lease is a held lease: the acquire's answer, with calls that present it.
// KeepAlive keeps ExpiresAt current; the fencing token does not change
// while the lease is held. Its calls may run concurrently (a keepalive
// goroutine beside updates: they read only the fields that do not
// change), but ExpiresAt is written by KeepAlive and is read safely only
// by the goroutine that calls it, or once it returned.
type Lease struct {
	c *Client
	wire.AcquireResponse
}

// Ref returns the reference used by the lease-scoped calls.
func (l *Lease) Ref() LeaseRef {
	return LeaseRef{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID, TxnID: l.TxnID, FencingToken: l.FencingToken}
}

// Acquire obtains a lease. The request carries a fresh idempotency key that
// is reused for every retry of this call.
func (c *Client) Acquire(ctx context.Context, req wire.AcquireRequest) (*Lease, error) {
	return c.AcquireWithKey(ctx, req, xid.New().String())
}

// AcquireWithKey is Acquire with a caller-chosen idempotency key: calls with
// the same key are the same request. "" sends none, and the call is not
// resent after an ambiguous failure (by this client or by Go's HTTP
// transport): resent, it would be another acquire.
func (c *Client) AcquireWithKey(ctx context.Context, req wire.AcquireRequest, idempotencyKey string) (*Lease, error) {
	req.Namespace = c.ns(req.Namespace)
	body, _ := json.Marshal(req)
	h := http.Header{}
	if idempotencyKey != "" {
		h.Set(wire.HeaderIdempotencyKey, idempotencyKey)
	}
	l := &Lease{c: c}
	if _, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/acquire", header: h, body: body,
		idempotent: idempotencyKey != ""}, &l.AcquireResponse); err != nil {
		return nil, err
	}
	return l, nil
}

// LeaseRef identifies a lease for calls made without a Lease value (for
// example by the CLI, which keeps leases in environment variables).
type LeaseRef struct {
	Namespace    string
	Key          string
	LeaseID      string
	TxnID        string
	FencingToken int64
}

func (r LeaseRef) query(c *Client) url.Values {
	return url.Values{"namespace": {c.ns(r.Namespace)}, "key": {r.Key}}
}

func (r LeaseRef) header() http.Header {
	h := http.Header{}
	if r.LeaseID != "" {
		h.Set(wire.HeaderLeaseID, r.LeaseID)
	}
	if r.TxnID != "" {
		h.Set(wire.HeaderTxnID, r.TxnID)
	}
	if r.FencingToken > 0 {
		h.Set(wire.HeaderFencingToken, strconv.FormatInt(r.FencingToken, 10))
	}
	return h
}

// KeepAlive extends a lease by ttl, rounded up to whole seconds (ttl 0: by
// its original TTL; negative: by the server's default TTL).
func (c *Client) KeepAlive(ctx context.Context, r LeaseRef, ttl time.Duration) (*wire.KeepAliveResponse, error) {
	var secs int64
	switch {
	case ttl > 0:
		secs = seconds(ttl)
	case ttl < 0:
		secs = -1
	}
	body, _ := json.Marshal(wire.KeepAliveRequest{Namespace: c.ns(r.Namespace), Key: r.Key, LeaseID: r.LeaseID,
		TxnID: r.TxnID, TTLSeconds: secs})
	var out wire.KeepAliveResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/keepalive", header: r.header(), body: body, idempotent: true}, &out)
	return &out, err
}

// Release commits (or, with rollback, abandons) the lease's transaction and
// releases every lease it holds.
func (c *Client) Release(ctx context.Context, r LeaseRef, rollback bool) (*wire.ReleaseResponse, error) {
	body, _ := json.Marshal(wire.ReleaseRequest{Namespace: c.ns(r.Namespace), Key: r.Key, LeaseID: r.LeaseID,
		TxnID: r.TxnID, Rollback: rollback})
	var out wire.ReleaseResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/release", header: r.header(), body: body, idempotent: true}, &out)
	return &out, err
}

// Conditions guard an update or removal.
type Conditions struct {
	IfVersion *int64
	IfETag    string
}

func (cond Conditions) apply(h http.Header) {
	if cond.IfVersion != nil {
		h.Set(wire.HeaderIfVersion, strconv.FormatInt(*cond.IfVersion, 10))
	}
	if cond.IfETag != "" {
		h.Set(wire.HeaderIfStateETag, cond.IfETag)
	}
}

// Update stages a JSON document under the lease's transaction.
func (c *Client) Update(ctx context.Context, r LeaseRef, doc []byte, cond Conditions) (*wire.UpdateResponse, error) {
	h := r.header()
	cond.apply(h)
	if doc == nil {
		doc = []byte{}
	}
	var out wire.UpdateResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/update", query: r.query(c), header: h, body: doc}, &out)
	return &out, err
}

// Remove stages the removal of the key's document.
func (c *Client) Remove(ctx context.Context, r LeaseRef, cond Conditions) (*wire.RemoveResponse, error) {
	h := r.header()
	cond.apply(h)
	var out wire.RemoveResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/remove", query: r.query(c), header: h}, &out)
	return &out, err
}

// Document is a read document; Exists is false when the key has no state.
type Document struct {
	Exists  bool
	Body    []byte
	Version int64
	ETag    string
}

// Get reads the document the lease holder sees (its staged write included).
func (c *Client) Get(ctx context.Context, r LeaseRef) (*Document, error) {
	return c.get(ctx, r.query(c), r.header())
}

// GetPublic reads the committed document of a key without a lease.
func (c *Client) GetPublic(ctx context.Context, ns, key string) (*Document, error) {
	return c.get(ctx, url.Values{"namespace": {c.ns(ns)}, "key": {key}, "public": {"1"}}, nil)
}

func (c *Client) get(ctx context.Context, q url.Values, h http.Header) (*Document, error) {
	var d *Document
	err := c.doRead(ctx, call{method: http.MethodPost, path: "/v1/get", query: q, header: h, idempotent: true}, func(resp *http.Response) error {
		d = &Document{Exists: resp.StatusCode == http.StatusOK, ETag: strings.Trim(resp.Header.Get(wire.HeaderETag), `"`)}
		d.Version, _ = strconv.ParseInt(resp.Header.Get(wire.HeaderKeyVersion), 10, 64)
		if d.Exists {
			var err error
			if d.Body, err = io.ReadAll(resp.Body); err != nil {
				return fmt.Errorf("client: read state: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Describe returns a key's lease and state metadata.
func (c *Client) Describe(ctx context.Context, ns, key string) (*wire.DescribeResponse, error) {
	var out wire.DescribeResponse
	_, err := c.doJSON(ctx, call{method: http.MethodGet, path: "/v1/describe",
		query: url.Values{"namespace": {c.ns(ns)}, "key": {key}}, idempotent: true}, &out)
	return &out, err
}

// Get reads the lease holder's view of the document.
func (l *Lease) Get(ctx context.Context) (*Document, error) { return l.c.Get(ctx, l.Ref()) }

// Update stages doc, guarded by cond.
func (l *Lease) Update(ctx context.Context, doc []byte, cond Conditions) (*wire.UpdateResponse, error) {
	return l.c.Update(ctx, l.Ref(), doc, cond)
}

// Remove stages the removal of the document.
func (l *Lease) Remove(ctx context.Context, cond Conditions) (*wire.RemoveResponse, error) {
	return l.c.Remove(ctx, l.Ref(), cond)
}

// KeepAlive extends the lease.
func (l *Lease) KeepAlive(ctx context.Context, ttl time.Duration) (*wire.KeepAliveResponse, error) {
	out, err := l.c.KeepAlive(ctx, l.Ref(), ttl)
	if err == nil {
		l.ExpiresAt = out.ExpiresAt
	}
	return out, err
}

// Release commits the lease's transaction (or rolls it back).
func (l *Lease) Release(ctx context.Context, rollback bool) error {
	_, err := l.c.Release(ctx, l.Ref(), rollback)
	return err
}
