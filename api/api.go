// Package api owns raftlockd's HTTP surface: the lockd-compatible v1
// endpoints, health and readiness probes and /metrics. Handlers only decode
// requests into service parameters and encode results; every rule lives in
// the services (packages rm and tc) and every error code is turned into an
// HTTP status in one table (errors.go).
package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/tc"
	"github.com/raftlockd/raftlockd/wire"
)

// Leases is the key service the handlers call.
type Leases interface {
	Acquire(ctx context.Context, p rm.AcquireParams) (*fsm.LeaseInfo, error)
	KeepAlive(ctx context.Context, ref rm.LeaseRef, ttlSeconds int64) (*fsm.LeaseInfo, error)
	Update(ctx context.Context, ref rm.LeaseRef, cond rm.Conditions, body rm.Body) (*fsm.WriteResult, error)
	Remove(ctx context.Context, ref rm.LeaseRef, cond rm.Conditions) (*fsm.WriteResult, error)
	Get(ctx context.Context, ref rm.LeaseRef, public bool, c rm.Consistency) (fsm.Doc, error)
	Describe(ctx context.Context, ns, key string, c rm.Consistency) (rm.Description, error)
}

// Releaser ends transactions.
type Releaser interface {
	Release(ctx context.Context, ref rm.LeaseRef, rollback bool) (tc.Outcome, error)
}

// Readiness says whether this node can serve requests now.
type Readiness interface {
	Ready(ctx context.Context) error
}

// Options configure the handler.
type Options struct {
	NodeID       string
	Leases       Leases
	Releaser     Releaser
	Ready        Readiness
	Leadership   Leadership      // names the leader in X-Raftlockd-Leader; optional
	Cluster      Cluster         // /v1/cluster/status, members, leave, remove-peer; optional
	Backups      Backups         // /v1/cluster/snapshot; optional
	TC           TCMembership    // lockd's /v1/tc/leader and /v1/tc/cluster/...; optional
	Coordinator  Coordinator     // /v1/txn/decide, replay, status and /v1/tc/rm/...; optional
	RM           ResourceManager // /v1/txn/prepare, commit, rollback; optional
	LeaderOf     Leader          // hands coordinator requests from a follower to the leader
	PeerHTTP     *http.Client    // used to reach the leader; nil: http.DefaultClient
	Queues       Queues          // /v1/queue/...; optional
	UTXOs        UTXOs           // /v1/utxo/...; optional
	Chain        Chain           // /v1/utxo/blocks/..., prune, status and /ui/status; optional
	Gatherer     prometheus.Gatherer
	Registerer   prometheus.Registerer
	Logger       *slog.Logger
	MaxBodyBytes int64       // JSON request bodies; state documents are limited by the key service
	Pprof        bool        // serve net/http/pprof under /debug/pprof/
	Access       AccessLists // /v1/auth/revoke|revoked, /v1/tc/trust; optional
	// Auth verifies callers' certificates (see endpointClass); nil serves
	// every endpoint to anyone (mTLS disabled).
	Auth Authenticator
	// TCAuthDisabled opens the coordinator and resource-manager endpoints
	// to callers without a certificate; the others still need one.
	TCAuthDisabled bool
	// MaxUTXOBodyBytes bounds the bodies of /v1/utxo/create and spend
	// (default 32 MiB); the other UTXO endpoints take MaxBodyBytes.
	MaxUTXOBodyBytes int64
	// MaxTTL is the longest lease (--max-ttl, default 1 h); a transaction's
	// expires_at_unix lies at most that far ahead.
	MaxTTL time.Duration
	// Clock is the time the island's expiries are judged by on this
	// server (the node's clock corrected to the members' median, as
	// commands are stamped with it): the times requests carry are checked
	// against it, and the times answers tell are counted on it, on a
	// follower as on the leader. nil: time.Now.
	Clock rm.Clock
}

type handler struct {
	Options
	metrics *httpMetrics
}

// New returns the HTTP handler of one node.
func New(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 64 << 10
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = time.Hour
	}
	if o.MaxUTXOBodyBytes <= 0 {
		o.MaxUTXOBodyBytes = defaultMaxUTXOBodyBytes
	}
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	if o.Auth != nil {
		o.Leases = guardedLeases{o.Leases}
		o.Releaser = guardedReleaser{o.Releaser}
		if o.Queues != nil {
			o.Queues = guardedQueues{o.Queues}
		}
		if o.UTXOs != nil {
			o.UTXOs = guardedUTXOs{o.UTXOs}
		}
	}
	h := &handler{Options: o, metrics: newHTTPMetrics(o.Registerer)}
	mux := http.NewServeMux()
	route := func(method, path string, fn func(http.ResponseWriter, *http.Request) error) {
		mux.Handle(path, h.wrap(path, method, fn))
	}
	route(http.MethodGet, "/healthz", h.healthz)
	route(http.MethodGet, "/readyz", h.readyz)
	route(http.MethodPost, "/v1/acquire", h.acquire)
	route(http.MethodPost, "/v1/keepalive", h.keepalive)
	route(http.MethodPost, "/v1/release", h.release)
	route(http.MethodPost, "/v1/get", h.get)
	route(http.MethodPost, "/v1/update", h.update)
	route(http.MethodPost, "/v1/remove", h.remove)
	route(http.MethodGet, "/v1/describe", h.describe)
	h.routeCluster(route)
	h.routeTxn(route)
	h.routeQueue(route)
	h.routeUTXO(route)
	h.routeChain(route)
	h.routeAccess(route)
	if o.Gatherer != nil {
		route(http.MethodGet, "/metrics", serve(promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{})))
	}
	if o.Pprof {
		route("", "/debug/pprof/", serve(http.HandlerFunc(pprof.Index)))
		route("", "/debug/pprof/cmdline", serve(http.HandlerFunc(pprof.Cmdline)))
		route("", "/debug/pprof/profile", serve(http.HandlerFunc(pprof.Profile)))
		route("", "/debug/pprof/symbol", serve(http.HandlerFunc(pprof.Symbol)))
		route("", "/debug/pprof/trace", serve(http.HandlerFunc(pprof.Trace)))
	}
	unknown := h.wrap("other", "", func(w http.ResponseWriter, r *http.Request) error {
		return errcode.NotFound.With("no endpoint %s", r.URL.Path)
	})
	mux.Handle("/", unknown)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ServeMux would redirect a path with empty, "." or ".." segments
		// to its clean form; no endpoint has such a path, so it is an
		// unknown endpoint like any other.
		if !cleanPath(r.URL.Path) {
			unknown.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// cleanPath reports whether p is a rooted path without empty, "." or ".."
// segments (a trailing slash aside).
func cleanPath(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	c := path.Clean(p)
	return c == p || c+"/" == p
}

// serve adapts a plain handler to the wrapped form.
func serve(hd http.Handler) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		hd.ServeHTTP(w, r)
		return nil
	}
}

// statusWriter remembers the status a handler wrote, and completes the
// response's headers (header) as they are sent.
type statusWriter struct {
	http.ResponseWriter
	status int
	header func(http.Header) // nil: nothing to add
}

// sending is called before the response's headers may go out.
func (s *statusWriter) sending(code int) {
	if s.status != 0 {
		return
	}
	s.status = code
	if s.header != nil {
		s.header(s.Header())
	}
}

func (s *statusWriter) WriteHeader(code int) {
	s.sending(code)
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// FlushError lets http.ResponseController flush; a flush sends the
// headers when nothing was written yet.
func (s *statusWriter) FlushError() error {
	s.sending(http.StatusOK)
	return http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.sending(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

// wrap adds what every endpoint shares: method check, correlation id, the
// serving node and the leader it knows, panic containment, error envelope
// and metrics.
func (h *handler) wrap(endpoint, method string, fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		corr := r.Header.Get(wire.HeaderCorrelationID)
		if corr == "" || len(corr) > 128 {
			corr = xid.New().String()
		}
		sw.Header().Set(wire.HeaderCorrelationID, corr)
		if h.NodeID != "" {
			sw.Header().Set(wire.HeaderServedBy, h.NodeID)
		}
		if h.Leadership != nil {
			// The leader this node knows when it answers, which a request
			// that waited (a blocked acquire across a failover) may not
			// have had when it arrived; an answer relayed from the leader
			// keeps the leader's own.
			sw.header = func(hd http.Header) {
				if hd.Get(wire.HeaderLeader) != "" {
					return
				}
				if id, _ := h.Leadership.Leader(); id != "" {
					hd.Set(wire.HeaderLeader, id)
				}
			}
		}
		defer func() {
			if p := recover(); p != nil {
				h.Logger.Error("handler panic", "endpoint", endpoint, "panic", p)
				if sw.status == 0 {
					writeError(r.Context(), sw, errcode.Internal.With("internal error"), h.Logger)
				}
			}
			h.metrics.observe(endpoint, sw.status, time.Since(start))
		}()
		r, err := h.authenticate(r, endpoint)
		switch {
		case err != nil:
		case method != "" && r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead):
			allow := method
			if method == http.MethodGet {
				allow += ", " + http.MethodHead // answered as the GET, without the body
			}
			sw.Header().Set("Allow", allow)
			err = errcode.MethodNotAllowed.With("%s needs %s", r.URL.Path, method)
		default:
			if _, qerr := url.ParseQuery(r.URL.RawQuery); qerr != nil {
				// Query would drop the malformed parameter, and the request
				// would act on another namespace or key than it names.
				err = errcode.InvalidParams.With("malformed query string: %v", qerr)
				break
			}
			ctx, cancel, terr := withClientTimeout(r)
			if terr != nil {
				err = terr
				break
			}
			defer cancel()
			r = r.WithContext(withCorrelation(ctx, corr))
			err = fn(sw, r)
		}
		if err != nil {
			if sw.status != 0 {
				h.Logger.Warn("error after response started", "endpoint", endpoint, "error", err)
				return
			}
			writeError(r.Context(), sw, err, h.Logger)
		}
	})
}

// maxClientTimeout bounds X-Raftlockd-Timeout.
const maxClientTimeout = 24 * time.Hour

// withClientTimeout gives the request's context the deadline the client
// announced in X-Raftlockd-Timeout, so that the request, and its
// forwarding to the leader, ends when the client stops waiting.
func withClientTimeout(r *http.Request) (context.Context, context.CancelFunc, error) {
	v := r.Header.Get(wire.HeaderTimeout)
	if v == "" {
		return r.Context(), func() {}, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 || d > maxClientTimeout {
		return nil, nil, errcode.InvalidTimeout.With("%s must be a positive duration of at most %s, such as 1.5s", wire.HeaderTimeout, maxClientTimeout)
	}
	e := errcode.Unavailable.With("the request's %s of %s passed", wire.HeaderTimeout, d)
	e.RetryAfter = 1
	ctx, cancel := context.WithTimeoutCause(r.Context(), d, e)
	return ctx, cancel, nil
}

type correlationKey struct{}

func withCorrelation(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey{}, id)
}

func correlation(ctx context.Context) string {
	id, _ := ctx.Value(correlationKey{}).(string)
	return id
}

// decodeJSON reads a bounded JSON object, rejecting unknown fields and
// trailing data. An empty body decodes as {}.
func (h *handler) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := readBody(w, r, h.MaxBodyBytes)
	if err != nil {
		return err
	}
	return decodeStrict(raw, v, "JSON")
}

// readBody reads a request body of at most limit bytes: more is
// request_too_large, a body that breaks off invalid_body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, errcode.RequestTooLarge.With("request body exceeds %d bytes", limit)
		}
		return nil, errcode.InvalidBody.With("reading body: %v", err)
	}
	return raw, nil
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func fencingHeader(r *http.Request, required bool) (int64, error) {
	v := r.Header.Get(wire.HeaderFencingToken)
	if v == "" {
		if required {
			return 0, errcode.MissingFencing.With("%s header is required", wire.HeaderFencingToken)
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0, errcode.InvalidFencing.With("%s must be a positive integer", wire.HeaderFencingToken)
	}
	return n, nil
}

func conditions(r *http.Request) (rm.Conditions, error) {
	c := rm.Conditions{IfETag: r.Header.Get(wire.HeaderIfStateETag)}
	if v := r.Header.Get(wire.HeaderIfVersion); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return c, errcode.InvalidVersion.With("%s must be a non-negative integer", wire.HeaderIfVersion)
		}
		c.IfVersion = &n
	}
	return c, nil
}

// lenientBool reads a boolean query parameter the way lockd does: anything
// that is not a boolean counts as false.
func lenientBool(r *http.Request, name string) bool {
	b, _ := strconv.ParseBool(r.URL.Query().Get(name))
	return b
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errcode.InvalidParams.With("%s must be a boolean", name)
	}
	return b, nil
}

// leaseRefFromHeaders builds the lease reference of get, update and remove,
// which name the key in the query and the lease in headers.
func leaseRefFromHeaders(r *http.Request) (rm.LeaseRef, error) {
	q := r.URL.Query()
	tok, err := fencingHeader(r, false)
	return rm.LeaseRef{Namespace: q.Get("namespace"), Key: q.Get("key"), LeaseID: r.Header.Get(wire.HeaderLeaseID),
		TxnID: r.Header.Get(wire.HeaderTxnID), Token: tok}, err
}

func unixSeconds(ms int64) int64 { return ms / 1000 }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func setStateHeaders(w http.ResponseWriter, version int64, etag string, token int64) {
	w.Header().Set(wire.HeaderKeyVersion, strconv.FormatInt(version, 10))
	if etag != "" {
		w.Header().Set(wire.HeaderETag, etag)
	}
	if token > 0 {
		w.Header().Set(wire.HeaderFencingToken, strconv.FormatInt(token, 10))
	}
}

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
	return nil
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) error {
	if h.Ready != nil {
		if err := h.Ready.Ready(r.Context()); err != nil {
			return err
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ready\n")
	return nil
}

func (h *handler) acquire(w http.ResponseWriter, r *http.Request) error {
	var req wire.AcquireRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	q := r.URL.Query()
	lease, err := h.Leases.Acquire(r.Context(), rm.AcquireParams{
		Namespace:   firstNonEmpty(req.Namespace, q.Get("namespace")),
		Key:         firstNonEmpty(req.Key, q.Get("key")),
		Owner:       req.Owner,
		TxnID:       firstNonEmpty(req.TxnID, r.Header.Get(wire.HeaderTxnID)),
		RequestID:   r.Header.Get(wire.HeaderIdempotencyKey),
		TTLSeconds:  req.TTLSeconds,
		BlockSecs:   req.BlockSecs,
		IfNotExists: req.IfNotExists,
	})
	if err != nil {
		return err
	}
	setStateHeaders(w, lease.Version, "", lease.Token)
	writeJSON(w, http.StatusOK, wire.AcquireResponse{
		Namespace: lease.Namespace, LeaseID: lease.LeaseID, TxnID: lease.TxnID, Key: lease.Key, Owner: lease.Owner,
		ExpiresAt: unixSeconds(lease.ExpiresAt), Version: lease.Version, StateETag: lease.ETag,
		FencingToken: lease.Token, CorrelationID: correlation(r.Context()),
	})
	return nil
}

func (h *handler) keepalive(w http.ResponseWriter, r *http.Request) error {
	var req wire.KeepAliveRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	tok, err := fencingHeader(r, true)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	lease, err := h.Leases.KeepAlive(r.Context(), rm.LeaseRef{
		Namespace: firstNonEmpty(req.Namespace, q.Get("namespace")), Key: firstNonEmpty(req.Key, q.Get("key")),
		LeaseID: req.LeaseID, TxnID: firstNonEmpty(req.TxnID, r.Header.Get(wire.HeaderTxnID)), Token: tok,
	}, req.TTLSeconds)
	if err != nil {
		return err
	}
	w.Header().Set(wire.HeaderFencingToken, strconv.FormatInt(lease.Token, 10))
	writeJSON(w, http.StatusOK, wire.KeepAliveResponse{ExpiresAt: unixSeconds(lease.ExpiresAt)})
	return nil
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) error {
	var req wire.ReleaseRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	tok, err := fencingHeader(r, false)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	out, err := h.Releaser.Release(r.Context(), rm.LeaseRef{
		Namespace: firstNonEmpty(req.Namespace, q.Get("namespace")), Key: firstNonEmpty(req.Key, q.Get("key")),
		LeaseID: req.LeaseID, TxnID: firstNonEmpty(req.TxnID, r.Header.Get(wire.HeaderTxnID)), Token: tok,
	}, req.Rollback)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ReleaseResponse{Released: out.Released})
	return nil
}

// consistency reads the stale=1 opt-in of get and describe.
func consistency(r *http.Request) (rm.Consistency, error) {
	stale, err := boolParam(r, "stale")
	if stale {
		return rm.Stale, err
	}
	return rm.Linearizable, err
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) error {
	c, err := consistency(r)
	if err != nil {
		return err
	}
	ref, err := leaseRefFromHeaders(r)
	if err != nil {
		return err
	}
	// As in lockd, a request that names a lease reads the holder's view
	// even with public=1.
	public := lenientBool(r, "public") && ref.LeaseID == ""
	doc, err := h.Leases.Get(r.Context(), ref, public, c)
	if err != nil {
		return err
	}
	setStateHeaders(w, doc.Version, doc.ETag, doc.Token)
	if !doc.Exists {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(doc.Bytes)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(doc.Bytes)
	return nil
}

func (h *handler) update(w http.ResponseWriter, r *http.Request) error {
	ref, err := leaseRefFromHeaders(r)
	if err != nil {
		return err
	}
	cond, err := conditions(r)
	if err != nil {
		return err
	}
	body := rm.Body{R: r.Body, ExpectedSHA256: strings.TrimSpace(r.Header.Get(wire.HeaderExpectedSHA256)), ExpectedBytes: -1}
	if body.ExpectedSHA256 != "" && !rm.ValidSHA256(body.ExpectedSHA256) {
		return errcode.InvalidChecksum.With("%s must be 64 hex digits", wire.HeaderExpectedSHA256)
	}
	if v := r.Header.Get(wire.HeaderExpectedBytes); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return errcode.InvalidSize.With("%s must be a non-negative integer", wire.HeaderExpectedBytes)
		}
		body.ExpectedBytes = n
	}
	res, err := h.Leases.Update(r.Context(), ref, cond, body)
	if err != nil {
		return err
	}
	setStateHeaders(w, res.Version, res.ETag, ref.Token)
	writeJSON(w, http.StatusOK, wire.UpdateResponse{NewVersion: res.Version, NewStateETag: res.ETag, Bytes: res.Bytes})
	return nil
}

func (h *handler) remove(w http.ResponseWriter, r *http.Request) error {
	ref, err := leaseRefFromHeaders(r)
	if err != nil {
		return err
	}
	cond, err := conditions(r)
	if err != nil {
		return err
	}
	res, err := h.Leases.Remove(r.Context(), ref, cond)
	if err != nil {
		return err
	}
	setStateHeaders(w, res.Version, "", ref.Token)
	writeJSON(w, http.StatusOK, wire.RemoveResponse{Removed: res.Removed, NewVersion: res.Version})
	return nil
}

func (h *handler) describe(w http.ResponseWriter, r *http.Request) error {
	c, err := consistency(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	d, err := h.Leases.Describe(r.Context(), q.Get("namespace"), q.Get("key"), c)
	if err != nil {
		return err
	}
	// A key never used is described as lockd does: version 0, no holder.
	rec := d.Record
	out := wire.DescribeResponse{Namespace: d.Namespace, Key: d.Key, Version: rec.Version, StateETag: rec.ETag,
		UpdatedAt: unixSeconds(rec.UpdatedAt), Waiters: rec.Waiters}
	if l := rec.Lease; l != nil {
		out.Owner, out.LeaseID, out.TxnID, out.FencingToken, out.ExpiresAt = l.Owner, l.ID, l.TxnID, l.Token, unixSeconds(l.ExpiresAt)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
