package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// Queues is the queue service the /v1/queue/... handlers call.
type Queues interface {
	Enqueue(ctx context.Context, p rm.EnqueueParams) (*fsm.MessageInfo, error)
	Dequeue(ctx context.Context, p rm.DequeueParams) (*rm.Delivery, error)
	Ack(ctx context.Context, ref rm.MessageRef) error
	Nack(ctx context.Context, ref rm.MessageRef, p rm.NackParams) (*fsm.QueueResult, error)
	Extend(ctx context.Context, ref rm.MessageRef, bySeconds int64) (*fsm.MessageInfo, error)
	Stats(ctx context.Context, ns, queue string, c rm.Consistency) (fsm.QueueStats, error)
	WatchDelivery(ctx context.Context, ns, queue, id, leaseID string) (<-chan fsm.Event, func(), error)
	Delivering(ctx context.Context, ns, queue, id, leaseID string) (bool, error)
	Limits() rm.QueueLimits
}

// multipartOverhead bounds what an enqueue body may hold besides the meta
// JSON and the payload: boundaries and part headers.
const multipartOverhead = 16 << 10

// streamWriteTimeout bounds one write of a delivery to a subscriber.
const streamWriteTimeout = 30 * time.Second

func (h *handler) routeQueue(route func(method, path string, fn func(http.ResponseWriter, *http.Request) error)) {
	if h.Queues == nil {
		return
	}
	route(http.MethodPost, "/v1/queue/enqueue", h.queueEnqueue)
	route(http.MethodPost, "/v1/queue/dequeue", h.queueDequeue(false))
	route(http.MethodPost, "/v1/queue/dequeueWithState", h.queueDequeue(true))
	route(http.MethodPost, "/v1/queue/subscribe", h.queueSubscribe(false))
	route(http.MethodPost, "/v1/queue/subscribeWithState", h.queueSubscribe(true))
	route(http.MethodPost, "/v1/queue/ack", h.queueAck)
	route(http.MethodPost, "/v1/queue/nack", h.queueNack)
	route(http.MethodPost, "/v1/queue/extend", h.queueExtend)
	route(http.MethodPost, "/v1/queue/stats", h.queueStats)
}

// multipartError turns a failure to read an enqueue body into its code.
func multipartError(err error) error {
	var e *errcode.Error
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &tooBig):
		return errcode.PayloadTooLarge.With("request body exceeds %d bytes", tooBig.Limit)
	}
	return errcode.InvalidBody.With("malformed multipart body: %v", err)
}

// payloadPart reads an enqueue's payload part: more than max bytes is
// payload_too_large, a broken body invalid_body.
type payloadPart struct {
	r        io.Reader
	n, limit int64
}

func (p *payloadPart) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.n > p.limit {
		return n, errcode.PayloadTooLarge.With("payload exceeds %d bytes", p.limit)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return n, multipartError(err)
	}
	return n, err
}

// closedBody is an enqueue body as the multipart reader sees it: its end is
// invalid_body, not io.EOF, unless its last line is the closing delimiter
// ("--boundary--", maybe followed by spaces or tabs). The reader answers the
// closing delimiter with a bare io.EOF, but also a part whose header lines
// the end of the body cuts short; it reads up to the end only when the
// closing delimiter has no line break after it or the body is cut short.
type closedBody struct {
	r     io.Reader
	close []byte // "--" + boundary + "--"
	line  []byte // the start of the last line read, up to len(close) bytes
	more  bool   // the last line goes on with more than spaces and tabs
}

func (b *closedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	read := p[:n]
	if i := bytes.LastIndexByte(read, '\n'); i >= 0 {
		b.line, b.more, read = b.line[:0], false, read[i+1:]
	}
	k := min(len(read), len(b.close)-len(b.line))
	b.line = append(b.line, read[:k]...)
	b.more = b.more || len(bytes.Trim(read[k:], " \t")) > 0
	if errors.Is(err, io.EOF) && (b.more || !bytes.Equal(b.line, b.close)) {
		return n, errcode.InvalidBody.With("the body ends before its closing boundary")
	}
	return n, err
}

// decodeStrict decodes one JSON object, rejecting unknown fields and
// trailing data.
func decodeStrict(raw []byte, v any, what string) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	// encoding/json would turn invalid UTF-8 into U+FFFD, making keys and
	// owners that differ in their bytes the same.
	if !utf8.Valid(raw) {
		return errcode.InvalidBody.With("the %s is not valid UTF-8", what)
	}
	// So would an escaped half of a UTF-16 surrogate pair on its own.
	if loneSurrogate(raw) {
		return errcode.InvalidBody.With("the %s escapes half of a UTF-16 surrogate pair (\\uD800-\\uDFFF) on its own", what)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errcode.InvalidBody.With("malformed %s: %v", what, err)
	}
	// More would let a stray ']' or '}' after the object through.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errcode.InvalidBody.With("unexpected data after the %s object", what)
	}
	return nil
}

// loneSurrogate reports whether raw, JSON text, has a \\u escape of a
// UTF-16 surrogate that is not half of a high-low pair.
func loneSurrogate(raw []byte) bool {
	if !bytes.Contains(raw, []byte(`\u`)) {
		return false
	}
	high := false // the escape just read is a high surrogate
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			if high {
				return true
			}
			continue
		}
		i++
		r, ok := escapedRune(raw, i)
		low := ok && r >= 0xDC00 && r <= 0xDFFF
		if low != high {
			return true // a high surrogate not followed by a low one, or a low one alone
		}
		if !ok {
			continue // another escape, or a malformed one the decoder refuses
		}
		high = !low && r >= 0xD800 && r <= 0xDBFF
		i += 4
	}
	return high
}

// escapedRune reads the code unit of the \\u escape whose 'u' is at raw[i].
func escapedRune(raw []byte, i int) (rune, bool) {
	if i+4 >= len(raw) || raw[i] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(raw[i+1:i+5]), 16, 16)
	return rune(v), err == nil
}

// rawJSON drops an absent or null JSON value.
func rawJSON(v json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(v); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil
	}
	return v
}

// queueEnqueue reads the multipart body lockd's client sends (a JSON meta
// part and a payload part, as multipart/form-data or multipart/related).
func (h *handler) queueEnqueue(w http.ResponseWriter, r *http.Request) error {
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || !strings.HasPrefix(strings.ToLower(mediaType), "multipart/") || params["boundary"] == "" {
		return errcode.InvalidBody.With("enqueue needs a multipart body (form-data or related) with a %q part and an optional %q part",
			wire.PartMeta, wire.PartPayload)
	}
	limit := h.Queues.Limits().MaxPayloadBytes
	body := &closedBody{r: http.MaxBytesReader(w, r.Body, limit+h.MaxBodyBytes+multipartOverhead),
		close: []byte("--" + params["boundary"] + "--")}
	mr := multipart.NewReader(body, params["boundary"])
	var meta wire.EnqueueRequest
	var payload []byte
	var partType string
	sawMeta, sawPayload := false, false
	for {
		part, err := mr.NextPart()
		if err == io.EOF { //nolint:errorlint // only the bare io.EOF is the closing delimiter (closedBody); a wrapped one is a truncated body
			break
		}
		if err != nil {
			return multipartError(err)
		}
		if part.FormName() == wire.PartMeta {
			if sawMeta {
				return errcode.InvalidBody.With("more than one %q part", wire.PartMeta)
			}
			sawMeta = true
			raw, err := io.ReadAll(io.LimitReader(part, h.MaxBodyBytes+1))
			if err != nil {
				return multipartError(err)
			}
			if int64(len(raw)) > h.MaxBodyBytes {
				return errcode.RequestTooLarge.With("the %q part exceeds %d bytes", wire.PartMeta, h.MaxBodyBytes)
			}
			if err := decodeStrict(raw, &meta, "meta part"); err != nil {
				return err
			}
			continue
		}
		// As in lockd, the payload is the part named "payload", or else the
		// first part that is not the meta part.
		if sawPayload {
			return errcode.InvalidBody.With("more than one payload part (%q)", part.FormName())
		}
		sawPayload = true
		partType = part.Header.Get("Content-Type")
		if payload, err = io.ReadAll(&payloadPart{r: part, limit: limit}); err != nil {
			return multipartError(err)
		}
	}
	q := r.URL.Query()
	contentType := meta.PayloadContentType
	if mt, _, err := mime.ParseMediaType(partType); contentType == "" && err == nil && mt != "application/octet-stream" {
		contentType = partType
	}
	msg, err := h.Queues.Enqueue(r.Context(), rm.EnqueueParams{
		Namespace:      firstNonEmpty(meta.Namespace, q.Get("namespace")),
		Queue:          firstNonEmpty(meta.Queue, q.Get("queue")),
		Payload:        bytes.NewReader(payload),
		ContentType:    contentType,
		Attributes:     rawJSON(meta.Attributes),
		DelaySeconds:   meta.DelaySeconds,
		VisibilitySecs: meta.VisibilityTimeoutSeconds,
		TTLSeconds:     meta.TTLSeconds,
		MaxAttempts:    meta.MaxAttempts,
		TxnID:          firstNonEmpty(meta.TxnID, r.Header.Get(wire.HeaderTxnID)),
		IdempotencyKey: r.Header.Get(wire.HeaderIdempotencyKey),
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.EnqueueResponse{Namespace: msg.Namespace, Queue: msg.Queue, MessageID: msg.ID,
		Attempts: msg.Attempts, MaxAttempts: msg.MaxAttempts, FailureAttempts: msg.Failures,
		NotVisibleUntilUnix: unixSeconds(msg.VisibleAt), VisibilityTimeoutSeconds: msg.Visibility / 1000,
		PayloadBytes: msg.Bytes, CorrelationID: correlation(r.Context())})
	return nil
}

// maxPrefetch bounds a subscription's unfinished deliveries (page_size):
// one stream does not lease a whole queue, and the server watches each of
// them.
const maxPrefetch = 100

// dequeueRequest is a decoded dequeue or subscribe request.
type dequeueRequest struct {
	params       rm.DequeueParams
	wait         int64 // wait_seconds as sent, a larger one capped at the server's maximum: -1 no wait, 0 that maximum
	includeState bool  // add a "state" part: the sidecar's committed document
	stream       bool  // one of many deliveries of a subscription
	prefetch     int   // a subscription's deliveries not yet ended, at most (page_size, 1 to maxPrefetch)
}

func (h *handler) decodeDequeue(w http.ResponseWriter, r *http.Request, withState bool) (dequeueRequest, error) {
	var req wire.DequeueRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return dequeueRequest{}, err
	}
	include, err := boolParam(r, "include_state")
	if err != nil {
		return dequeueRequest{}, err
	}
	q := r.URL.Query()
	d := dequeueRequest{wait: req.WaitSeconds, includeState: include && withState, prefetch: min(max(1, req.PageSize), maxPrefetch), params: rm.DequeueParams{
		Namespace:      firstNonEmpty(req.Namespace, q.Get("namespace")),
		Queue:          firstNonEmpty(req.Queue, q.Get("queue")),
		Owner:          firstNonEmpty(req.Owner, q.Get("owner")),
		VisibilitySecs: req.VisibilityTimeoutSeconds,
		TxnID:          firstNonEmpty(req.TxnID, r.Header.Get(wire.HeaderTxnID)),
		WithState:      withState,
	}}
	maxWait := int64((h.Queues.Limits().MaxWait + time.Second - 1) / time.Second)
	switch {
	case req.WaitSeconds < wire.BlockNoWait:
		return d, errcode.InvalidParams.With("wait_seconds must be -1 (no wait), 0 (the server's maximum) or positive")
	case req.WaitSeconds == 0:
		d.params.WaitSeconds = maxWait
	case req.WaitSeconds > 0:
		// The server waits no longer than its maximum, and the retry
		// hint of a wait that ends empty says so.
		d.params.WaitSeconds = req.WaitSeconds
		d.wait = min(req.WaitSeconds, maxWait)
	}
	return d, nil
}

// dequeueError answers a dequeue that delivered nothing as lockd does: 409
// waiting, with a retry hint of the wait (0 when the caller would not wait).
func dequeueError(err error, wait int64) error {
	if !errors.Is(err, errcode.QueueEmpty) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	e := errcode.Waiting.With("no messages available")
	switch {
	case wait > 0:
		e.RetryAfter = wait
	case wait == 0:
		e.RetryAfter = 1
	}
	return e
}

// abandon hands back a delivery the client will not receive (it went away
// before the delivery was written), without counting it as a failed
// attempt. A delivery enlisted in a transaction is left to its lease: handing
// it back would roll the whole transaction back.
func (h *handler) abandon(d *rm.Delivery) {
	m := d.Message
	if m == nil || m.Lease == nil || m.Lease.TxnID != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := h.Queues.Nack(ctx, rm.MessageRef{Namespace: m.Namespace, Queue: m.Queue, MessageID: m.ID,
		LeaseID: m.Lease.ID, Token: m.Lease.Token}, rm.NackParams{Defer: true}); err != nil {
		h.Logger.Warn("handing back an undelivered message", "queue", m.Queue, "message", m.ID, "error", err)
	}
}

func metaETag(m *fsm.MessageInfo) string {
	if m.Lease == nil {
		return ""
	}
	return strconv.FormatInt(m.Lease.Token, 10)
}

// wireMessage describes a delivery. visSecs is the visibility the dequeue
// asked for (0: the message's own).
func (h *handler) wireMessage(ctx context.Context, d *rm.Delivery, visSecs int64) *wire.Message {
	m := d.Message
	vis := m.Visibility / 1000
	if visSecs > 0 {
		vis = min(visSecs, int64(h.Queues.Limits().MaxVisibility/time.Second))
	}
	out := &wire.Message{Namespace: m.Namespace, Queue: m.Queue, MessageID: m.ID, Attempts: m.Attempts,
		MaxAttempts: m.MaxAttempts, FailureAttempts: m.Failures, NotVisibleUntilUnix: unixSeconds(m.VisibleAt),
		VisibilityTimeoutSeconds: vis, Attributes: m.Attributes, PayloadContentType: m.ContentType,
		PayloadBytes: m.Bytes, CorrelationID: correlation(ctx), MetaETag: metaETag(m)}
	if l := m.Lease; l != nil {
		out.LeaseID, out.LeaseExpiresAtUnix, out.FencingToken, out.TxnID = l.ID, unixSeconds(l.ExpiresAt), l.Token, l.TxnID
	}
	if s := m.State; s != nil {
		out.StateLeaseID, out.StateLeaseExpiresAtUnix, out.StateFencingToken, out.StateTxnID =
			s.LeaseID, unixSeconds(s.ExpiresAt), s.Token, s.TxnID
		out.StateETag = d.State.ETag
	}
	return out
}

// writeDelivery writes one delivery the way lockd does: a JSON "meta" part
// holding a DequeueResponse and a "payload" part (always, empty or not),
// then, when asked for (include_state=1), a "state" part with the sidecar's
// committed document, empty when it has none.
func (h *handler) writeDelivery(ctx context.Context, mw *multipart.Writer, d *rm.Delivery, req dequeueRequest) error {
	if err := writeMeta(mw, &wire.DequeueResponse{Message: h.wireMessage(ctx, d, req.params.VisibilitySecs)}); err != nil {
		return err
	}
	last := d.Payload
	ctype := d.Message.ContentType
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	hdr := textproto.MIMEHeader{}
	hdr.Set("Content-Type", ctype)
	hdr.Set("Content-Length", strconv.Itoa(len(d.Payload)))
	hdr.Set("Content-Disposition", `form-data; name="`+wire.PartPayload+`"`)
	part, err := mw.CreatePart(hdr)
	if err != nil {
		return fmt.Errorf("api: write delivery: %w", err)
	}
	if _, err := part.Write(d.Payload); err != nil {
		return fmt.Errorf("api: write delivery: %w", err)
	}
	if req.includeState {
		last = d.State.Bytes
		if err := writeState(mw, d.State); err != nil {
			return err
		}
	}
	if req.stream && heldBack(last, mw.Boundary()) {
		// A reader cannot tell a part ending in "\r", "\r\n", ... from the
		// start of the next boundary and waits for it; on a stream that
		// would hold this delivery back until the next one. A meta part
		// without a message ends it now.
		return writeMeta(mw, &wire.DequeueResponse{})
	}
	return nil
}

// heldBack reports whether a multipart reader would hold back the end of
// data until more of the body arrives: a "\r" near its end, or the whole of
// it a start of the boundary line ("-", "--", ...).
func heldBack(data []byte, boundary string) bool {
	if len(data) > 0 && strings.HasPrefix("--"+boundary, string(data)) {
		return true
	}
	return bytes.IndexByte(data[max(0, len(data)-len(boundary)-4):], '\r') >= 0
}

func writeMeta(mw *multipart.Writer, meta *wire.DequeueResponse) error {
	raw, err := json.Marshal(meta)
	if err != nil {
		return fmt.Errorf("api: encode delivery: %w", err)
	}
	hdr := textproto.MIMEHeader{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Disposition", `form-data; name="`+wire.PartMeta+`"`)
	part, err := mw.CreatePart(hdr)
	if err == nil {
		_, err = part.Write(append(raw, '\n'))
	}
	if err != nil {
		return fmt.Errorf("api: write delivery: %w", err)
	}
	return nil
}

func writeState(mw *multipart.Writer, doc fsm.Doc) error {
	hdr := textproto.MIMEHeader{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(doc.Bytes)))
	hdr.Set("Content-Disposition", `form-data; name="`+wire.PartState+`"`)
	hdr.Set(wire.HeaderKeyVersion, strconv.FormatInt(doc.Version, 10))
	if doc.Exists {
		hdr.Set(wire.HeaderETag, doc.ETag)
	}
	part, err := mw.CreatePart(hdr)
	if err == nil {
		_, err = part.Write(doc.Bytes)
	}
	if err != nil {
		return fmt.Errorf("api: write delivery: %w", err)
	}
	return nil
}

func startMultipart(w http.ResponseWriter) *multipart.Writer {
	mw := multipart.NewWriter(w)
	w.Header().Set("Content-Type", "multipart/related; boundary="+mw.Boundary())
	w.WriteHeader(http.StatusOK)
	return mw
}

// queueDequeue leases the next message of a queue, waiting on the server
// for up to wait_seconds, and answers it as multipart/related.
func (h *handler) queueDequeue(withState bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		req, err := h.decodeDequeue(w, r, withState)
		if err != nil {
			return err
		}
		// The wait may outlast the server's read timeout, whose expiry
		// would end the request.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		d, err := h.Queues.Dequeue(r.Context(), req.params)
		if err != nil {
			return dequeueError(err, req.wait)
		}
		if err := r.Context().Err(); err != nil {
			h.abandon(d)
			return fmt.Errorf("api: dequeue: %w", err)
		}
		mw := startMultipart(w)
		if err := h.writeDelivery(r.Context(), mw, d, req); err != nil {
			// The client went away while the delivery was written: it
			// did not get all of it, so it goes back, as when the client
			// left before.
			h.abandon(d)
			return err
		}
		return mw.Close()
	}
}

// queueSubscribe streams deliveries as parts of one multipart/related
// response until the client goes away. As in lockd, the response starts
// with the first delivery: when none comes within the first wait the answer
// is 409 waiting. With wait_seconds -1 the stream ends once the queue has
// nothing ready. At most prefetch deliveries of the stream are unfinished
// at a time: the next message is leased once the subscriber acks or nacks
// one of them (or its lease runs out), not while the earlier ones wait in
// the connection's buffers; with wait_seconds -1 the stream ends instead of
// waiting for that.
func (h *handler) queueSubscribe(withState bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		req, err := h.decodeDequeue(w, r, withState)
		if err != nil {
			return err
		}
		req.stream = true
		ctx := r.Context()
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		var mw *multipart.Writer
		var open []deliveryWatch
		defer func() {
			for _, o := range open {
				o.stop()
			}
		}()
		// A wait for the end of a delivery lasts a round of the wait for a
		// message, which the server caps at its maximum.
		round := h.Queues.Limits().MaxWait
		if secs := req.params.WaitSeconds; secs < int64(round/time.Second) {
			round = time.Duration(secs) * time.Second
		}
		round = max(round, time.Second)
		for {
			if open, err = finished(ctx, open, req.prefetch, req.wait != wire.BlockNoWait, round); err != nil {
				if ctx.Err() == nil {
					h.Logger.Warn("subscription ends", "queue", req.params.Queue, "error", err)
				}
				break
			}
			if ctx.Err() != nil || len(open) >= req.prefetch {
				// Gone, or not waiting for the subscriber to finish with a
				// delivery (wait_seconds -1).
				break
			}
			d, err := h.Queues.Dequeue(ctx, req.params)
			if err != nil {
				if mw == nil {
					return dequeueError(err, req.wait)
				}
				if errors.Is(err, errcode.QueueEmpty) && req.params.WaitSeconds > 0 && ctx.Err() == nil {
					continue
				}
				if ctx.Err() == nil && !errors.Is(err, errcode.QueueEmpty) {
					h.Logger.Warn("subscription ends", "queue", req.params.Queue, "error", err)
				}
				break
			}
			if ctx.Err() != nil {
				h.abandon(d)
				break
			}
			// A certificate revoked (or whose CA was dropped) since the
			// stream began gets no further delivery.
			if _, err := h.authenticate(r, r.URL.Path); err != nil {
				h.abandon(d)
				if mw == nil {
					return err
				}
				break
			}
			if mw == nil {
				mw = startMultipart(w)
			}
			_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
			err = h.writeDelivery(ctx, mw, d, req)
			if err == nil {
				err = rc.Flush()
			}
			if err != nil {
				h.abandon(d)
				return err
			}
			m := d.Message
			w := deliveryWatch{watch: func() (<-chan fsm.Event, func(), error) {
				return h.Queues.WatchDelivery(ctx, m.Namespace, m.Queue, m.ID, m.Lease.ID)
			}, held: func() (bool, error) {
				return h.Queues.Delivering(ctx, m.Namespace, m.Queue, m.ID, m.Lease.ID)
			}}
			if err := w.start(); err != nil {
				if ctx.Err() == nil {
					h.Logger.Warn("subscription ends", "queue", req.params.Queue, "error", err)
				}
				break
			}
			open = append(open, w)
		}
		if mw == nil {
			return fmt.Errorf("api: subscribe: %w", ctx.Err())
		}
		_ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return mw.Close()
	}
}

// deliveryWatch waits for the end of a delivery a subscriber was sent.
type deliveryWatch struct {
	ended <-chan fsm.Event
	stop  func()
	watch func() (<-chan fsm.Event, func(), error)
	held  func() (bool, error) // whether the delivery goes on, as the leader confirms
}

func (w *deliveryWatch) start() (err error) {
	w.ended, w.stop, err = w.watch()
	return err
}

// over reports whether ev, an event of the watch, ends the delivery. A
// restored state is no end: the watch starts again in the new state (the
// delivery may be there still), and is over when that fails.
func (w *deliveryWatch) over(ev fsm.Event) bool {
	w.stop()
	return ev.Kind != fsm.EventRestored || w.start() != nil
}

// finished drops the watches of deliveries that ended, whichever they are,
// and, while limit or more remain and wait is set, waits for any of them to
// end (or for ctx): a subscriber that finishes a newer delivery before an
// older one frees a slot at once. After each round without an end it asks
// the leader whether the deliveries go on: a server cut off from its
// cluster hears of no end, and answers the failure to reach a leader
// instead of holding the stream until it is back.
func finished(ctx context.Context, open []deliveryWatch, limit int, wait bool, round time.Duration) ([]deliveryWatch, error) {
	for i := 0; i < len(open); {
		select {
		case ev := <-open[i].ended:
			if open[i].over(ev) {
				open = slices.Delete(open, i, i+1)
				continue
			}
		default:
		}
		i++
	}
	for len(open) >= limit && wait && len(open) > 0 {
		timer := time.NewTimer(round)
		cases := make([]reflect.SelectCase, 0, len(open)+2)
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)})
		for _, o := range open {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(o.ended)})
		}
		chosen, v, _ := reflect.Select(cases)
		timer.Stop()
		switch {
		case chosen == 0:
			return open, nil
		case chosen == 1:
			var err error
			if open, err = confirmed(open); err != nil {
				return open, err
			}
		default:
			if ev, _ := v.Interface().(fsm.Event); open[chosen-2].over(ev) {
				open = slices.Delete(open, chosen-2, chosen-1)
			}
		}
	}
	return open, nil
}

// confirmed drops the watches of deliveries that the leader says ended.
func confirmed(open []deliveryWatch) ([]deliveryWatch, error) {
	for i := 0; i < len(open); {
		held, err := open[i].held()
		if err != nil {
			return open, err
		}
		if !held {
			open[i].stop()
			open = slices.Delete(open, i, i+1)
			continue
		}
		i++
	}
	return open, nil
}

// messageRef names the delivery an ack, nack or extend acts on. meta_etag,
// when sent, must be the delivery's (its fencing token in decimal).
func messageRef(r *http.Request, ns, queue, id, lease string, token int64, etag, txn string) (rm.MessageRef, error) {
	ref := rm.MessageRef{Namespace: firstNonEmpty(ns, r.URL.Query().Get("namespace")), Queue: queue, MessageID: id,
		LeaseID: lease, Token: token}
	if token < 0 {
		return ref, errcode.InvalidFencing.With("fencing_token must be positive")
	}
	if txn != "" {
		if _, err := rm.TxnID(txn); err != nil {
			return ref, err
		}
	}
	if etag = strings.Trim(strings.TrimSpace(etag), `"`); etag != "" {
		n, err := strconv.ParseInt(etag, 10, 64)
		if err != nil || n <= 0 || (token != 0 && n != token) {
			return ref, errcode.QueueLeaseMismatch.With("meta_etag %q is not the delivery's", etag)
		}
		ref.Token = n
	}
	return ref, nil
}

func (h *handler) queueAck(w http.ResponseWriter, r *http.Request) error {
	var req wire.AckRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	ref, err := messageRef(r, req.Namespace, req.Queue, req.MessageID, req.LeaseID, req.FencingToken, req.MetaETag, req.TxnID)
	if err != nil {
		return err
	}
	if err := h.Queues.Ack(r.Context(), ref); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.AckResponse{Acked: true, CorrelationID: correlation(r.Context())})
	return nil
}

func (h *handler) queueNack(w http.ResponseWriter, r *http.Request) error {
	var req wire.NackRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	ref, err := messageRef(r, req.Namespace, req.Queue, req.MessageID, req.LeaseID, req.FencingToken, req.MetaETag, req.TxnID)
	if err != nil {
		return err
	}
	var deferred bool
	switch req.Intent {
	case "", wire.NackIntentFailure:
	case wire.NackIntentDefer:
		deferred = true
	default:
		return errcode.InvalidParams.With("intent must be %q or %q", wire.NackIntentFailure, wire.NackIntentDefer)
	}
	res, err := h.Queues.Nack(r.Context(), ref, rm.NackParams{Defer: deferred, DelaySeconds: req.DelaySeconds,
		LastError: rawJSON(req.LastError)})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.NackResponse{Requeued: res.Requeued, DeadLetterQueue: res.DeadLetter,
		CorrelationID: correlation(r.Context())})
	return nil
}

func (h *handler) queueExtend(w http.ResponseWriter, r *http.Request) error {
	var req wire.ExtendRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	ref, err := messageRef(r, req.Namespace, req.Queue, req.MessageID, req.LeaseID, req.FencingToken, req.MetaETag, req.TxnID)
	if err != nil {
		return err
	}
	m, err := h.Queues.Extend(r.Context(), ref, req.ExtendBySeconds)
	if err != nil {
		return err
	}
	by := m.Visibility / 1000
	if req.ExtendBySeconds > 0 {
		by = min(req.ExtendBySeconds, int64(h.Queues.Limits().MaxVisibility/time.Second))
	}
	out := wire.ExtendResponse{VisibilityTimeoutSeconds: by, MetaETag: metaETag(m), CorrelationID: correlation(r.Context())}
	if m.Lease != nil {
		out.LeaseExpiresAtUnix = unixSeconds(m.Lease.ExpiresAt)
	}
	if m.State != nil {
		out.StateLeaseExpiresAtUnix = unixSeconds(m.State.ExpiresAt)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *handler) queueStats(w http.ResponseWriter, r *http.Request) error {
	var req wire.QueueStatsRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	c, err := consistency(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	ns, queue, err := rm.QueueRef(firstNonEmpty(req.Namespace, q.Get("namespace")), firstNonEmpty(req.Queue, q.Get("queue")))
	if err != nil {
		return err
	}
	st, err := h.Queues.Stats(r.Context(), ns, queue, c)
	if err != nil {
		return err
	}
	out := wire.QueueStatsResponse{Namespace: ns, Queue: queue, Available: st.Head != nil,
		WaitingConsumers: st.Waiting, PendingCandidates: st.Ready, TotalConsumers: st.Waiting,
		CorrelationID: correlation(r.Context()), Ready: st.Ready, InFlight: st.InFlight, Delayed: st.Delayed,
		Staged: st.Staged, DeadLetterReady: st.DeadReady}
	if m := st.Head; m != nil {
		out.HeadMessageID, out.HeadEnqueuedAtUnix, out.HeadNotVisibleUntilUnix = m.ID, unixSeconds(m.EnqueuedAt), unixSeconds(m.VisibleAt)
		out.HeadAgeSeconds = max(0, h.Clock.Now().UnixMilli()-m.EnqueuedAt) / 1000
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
