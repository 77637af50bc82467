package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// Queues: enqueue, dequeue (one message, or a stream of them with
// Subscribe), ack, nack, extend and stats.

// Delivery is a leased message: its metadata, payload and, for a stateful
// dequeue asked to include it, the state sidecar's committed document.
type Delivery struct {
	c       *Client
	Message wire.Message
	Payload []byte
	// State is the sidecar's committed document (DequeueWithState and
	// SubscribeWithState); Exists is false when it has none.
	State *Document

	finished atomic.Bool // acked or nacked through Ack or Nack
	mu       sync.Mutex  // guards Message while Extend updates it
}

// message returns a copy of d.Message, taken while no Extend changes it.
func (d *Delivery) message() wire.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.Message
}

// StateRef is the lease of the delivery's state sidecar, for Update and Get
// of "q/<queue>/state/<message id>"; ok is false without a sidecar.
func (d *Delivery) StateRef() (ref LeaseRef, ok bool) {
	m := d.message()
	if m.StateLeaseID == "" {
		return LeaseRef{}, false
	}
	return LeaseRef{Namespace: m.Namespace, Key: "q/" + m.Queue + "/state/" + m.MessageID, LeaseID: m.StateLeaseID,
		TxnID: m.StateTxnID, FencingToken: m.StateFencingToken}, true
}

// Ack acknowledges the delivery: the message (and its sidecar) is removed.
func (d *Delivery) Ack(ctx context.Context) error {
	m := d.message()
	_, err := d.c.Ack(ctx, wire.AckRequest{Namespace: m.Namespace, Queue: m.Queue, MessageID: m.MessageID,
		LeaseID: m.LeaseID, FencingToken: m.FencingToken, MetaETag: m.MetaETag})
	d.finished.Store(err == nil)
	return err
}

// Nack hands the delivery back: intent wire.NackIntentFailure (counts
// against max_attempts) or wire.NackIntentDefer, visible again after delay.
func (d *Delivery) Nack(ctx context.Context, intent string, delay time.Duration, lastError json.RawMessage) (*wire.NackResponse, error) {
	m := d.message()
	out, err := d.c.Nack(ctx, wire.NackRequest{Namespace: m.Namespace, Queue: m.Queue, MessageID: m.MessageID,
		LeaseID: m.LeaseID, FencingToken: m.FencingToken, MetaETag: m.MetaETag, Intent: intent,
		DelaySeconds: seconds(delay), LastError: lastError})
	d.finished.Store(err == nil)
	return out, err
}

// Extend extends the delivery's lease (and its sidecar's) by by (0: the
// message's visibility timeout). It may run while another goroutine acks
// or nacks the delivery (a heartbeat); read the new expiry from its answer
// rather than from Message in that case.
func (d *Delivery) Extend(ctx context.Context, by time.Duration) (*wire.ExtendResponse, error) {
	m := d.message()
	out, err := d.c.Extend(ctx, wire.ExtendRequest{Namespace: m.Namespace, Queue: m.Queue, MessageID: m.MessageID,
		LeaseID: m.LeaseID, FencingToken: m.FencingToken, MetaETag: m.MetaETag, ExtendBySeconds: seconds(by)})
	if err == nil {
		d.mu.Lock()
		d.Message.LeaseExpiresAtUnix = out.LeaseExpiresAtUnix
		if out.StateLeaseExpiresAtUnix > 0 {
			d.Message.StateLeaseExpiresAtUnix = out.StateLeaseExpiresAtUnix
		}
		d.mu.Unlock()
	}
	return out, err
}

// seconds rounds a positive duration up to whole seconds.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Enqueue adds a message to a queue. The request carries a fresh
// idempotency key, reused for every retry of this call, so that a retry
// after a lost answer enqueues the message once.
func (c *Client) Enqueue(ctx context.Context, req wire.EnqueueRequest, payload []byte) (*wire.EnqueueResponse, error) {
	return c.EnqueueWithKey(ctx, req, payload, xid.New().String())
}

// EnqueueWithKey is Enqueue with a caller-chosen idempotency key ("" sends
// none, and the call is not retried after an ambiguous failure).
func (c *Client) EnqueueWithKey(ctx context.Context, req wire.EnqueueRequest, payload []byte, idempotencyKey string) (*wire.EnqueueResponse, error) {
	req.Namespace = c.ns(req.Namespace)
	body, contentType, err := EnqueueBody(req, payload)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set("Content-Type", contentType)
	if idempotencyKey != "" {
		h.Set(wire.HeaderIdempotencyKey, idempotencyKey)
	}
	var out wire.EnqueueResponse
	_, err = c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/queue/enqueue", header: h, body: body,
		idempotent: idempotencyKey != ""}, &out)
	return &out, err
}

// EnqueueBody builds the multipart/form-data body of an enqueue: the JSON
// "meta" part and the "payload" part. It returns the body and its
// Content-Type.
func EnqueueBody(req wire.EnqueueRequest, payload []byte) ([]byte, string, error) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	meta, err := json.Marshal(req)
	if err != nil {
		return nil, "", fmt.Errorf("client: encode enqueue meta: %w", err)
	}
	hdr := textproto.MIMEHeader{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Disposition", `form-data; name="`+wire.PartMeta+`"`)
	part, err := mw.CreatePart(hdr)
	if err == nil {
		_, err = part.Write(meta)
	}
	ctype := req.PayloadContentType
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	hdr = textproto.MIMEHeader{}
	hdr.Set("Content-Type", ctype)
	hdr.Set("Content-Disposition", `form-data; name="`+wire.PartPayload+`"`)
	if err == nil {
		part, err = mw.CreatePart(hdr)
	}
	if err == nil {
		_, err = part.Write(payload)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return nil, "", fmt.Errorf("client: build enqueue body: %w", err)
	}
	return buf.Bytes(), mw.FormDataContentType(), nil
}

// Dequeue leases the next message of a queue. The server waits up to
// req.WaitSeconds for one (0: its maximum, wire.BlockNoWait: not at all);
// when none comes the error is errcode.Waiting.
func (c *Client) Dequeue(ctx context.Context, req wire.DequeueRequest) (*Delivery, error) {
	return c.dequeue(ctx, "/v1/queue/dequeue", req, false)
}

// DequeueWithState is Dequeue that also leases the message's state sidecar
// and returns its committed document in Delivery.State.
func (c *Client) DequeueWithState(ctx context.Context, req wire.DequeueRequest) (*Delivery, error) {
	return c.dequeue(ctx, "/v1/queue/dequeueWithState", req, true)
}

func (c *Client) dequeue(ctx context.Context, path string, req wire.DequeueRequest, withState bool) (*Delivery, error) {
	resp, dr, err := c.openDeliveries(ctx, path, req, withState)
	if err != nil {
		return nil, err
	}
	d, err := dr.next()
	switch {
	case err != nil && d != nil:
		// Leased to this call, but not all of it arrived.
		resp.Body.Close()
		return nil, d.HandBack(ctx, err)
	case errors.Is(err, io.EOF):
		resp.Body.Close()
		return nil, fmt.Errorf("client: %s: the answer holds no delivery", path)
	case err != nil:
		resp.Body.Close()
		return nil, err
	}
	// The closing boundary follows the delivery at once: read it, so that
	// the connection is kept.
	closeBody(resp)
	return d, nil
}

// handBackTimeout bounds a hand-back made after its caller's context ended.
const handBackTimeout = 5 * time.Second

// HandBack returns a delivery this consumer will not process to its queue
// at once, without spending an attempt (a nack with intent defer), instead
// of leaving it leased until its lease runs out. cause, why it is handed
// back, is wrapped in the error HandBack always answers, which also says
// what became of the delivery. A delivery enlisted in a transaction
// (Message.TxnID) is not handed back: a nack would roll the whole
// transaction back. The nack is made even when ctx has ended, within a few
// seconds.
func (d *Delivery) HandBack(ctx context.Context, cause error) error {
	if m := d.message(); m.TxnID != "" {
		return fmt.Errorf("%w (message %s stays leased in transaction %s until its lease runs out or the transaction ends)",
			cause, m.MessageID, m.TxnID)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	if _, err := d.Nack(ctx, wire.NackIntentDefer, 0, nil); err != nil {
		return fmt.Errorf("%w; handing message %s back failed too, so it stays leased until its lease runs out: %w",
			cause, d.Message.MessageID, err)
	}
	return fmt.Errorf("%w (message %s was handed back to the queue)", cause, d.Message.MessageID)
}

func (c *Client) openDeliveries(ctx context.Context, path string, req wire.DequeueRequest, withState bool) (*http.Response, *deliveryReader, error) {
	req.Namespace = c.ns(req.Namespace)
	body, _ := json.Marshal(req)
	var q url.Values
	if withState {
		q = url.Values{"include_state": {"1"}}
	}
	resp, err := c.do(ctx, call{method: http.MethodPost, path: path, query: q, body: body})
	if err != nil {
		return nil, nil, err
	}
	mediaType, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || !strings.HasPrefix(mediaType, "multipart/") || params["boundary"] == "" {
		resp.Body.Close()
		return nil, nil, fmt.Errorf("client: %s answered %q, not multipart", path, resp.Header.Get("Content-Type"))
	}
	return resp, &deliveryReader{c: c, mr: multipart.NewReader(resp.Body, params["boundary"]), withState: withState}, nil
}

// deliveryReader reads deliveries from a multipart/related answer: per
// delivery a "meta" part, a "payload" part and, when asked for, a "state"
// part.
type deliveryReader struct {
	c         *Client
	mr        *multipart.Reader
	withState bool
}

func (r *deliveryReader) part(name string) (*multipart.Part, error) {
	p, err := r.mr.NextPart()
	if err != nil {
		return nil, err
	}
	if got := p.FormName(); got != "" && got != name {
		return nil, fmt.Errorf("client: unexpected part %q where %q belongs", got, name)
	}
	return p, nil
}

// next returns the next delivery, or io.EOF at the end of the answer. When
// a delivery's meta part arrived (so it is leased) but the rest failed, it
// answers the delivery so far along with the error.
func (r *deliveryReader) next() (*Delivery, error) {
	var meta wire.DequeueResponse
	for meta.Message == nil {
		// A meta part without a message carries nothing (lockd's clients
		// skip it too).
		p, err := r.part(wire.PartMeta)
		if err == io.EOF { //nolint:errorlint // only the bare io.EOF is the closing boundary; a wrapped one is a cut stream
			return nil, io.EOF
		}
		if err != nil {
			return nil, fmt.Errorf("client: read delivery: %w", err)
		}
		if err := json.NewDecoder(p).Decode(&meta); err != nil {
			return nil, fmt.Errorf("client: decode delivery: %w", err)
		}
	}
	d := &Delivery{c: r.c, Message: *meta.Message}
	p, err := r.part(wire.PartPayload)
	if err == nil {
		d.Payload, err = readPart(p)
	}
	if err != nil {
		return d, fmt.Errorf("client: read payload: %w", err)
	}
	if !r.withState {
		return d, nil
	}
	if p, err = r.part(wire.PartState); err != nil {
		return d, fmt.Errorf("client: read state: %w", err)
	}
	doc := &Document{ETag: strings.Trim(p.Header.Get(wire.HeaderETag), `"`)}
	doc.Version, _ = strconv.ParseInt(p.Header.Get(wire.HeaderKeyVersion), 10, 64)
	if doc.Body, err = readPart(p); err != nil {
		return d, fmt.Errorf("client: read state: %w", err)
	}
	doc.Exists = doc.ETag != ""
	d.State = doc
	return d, nil
}

// readPart reads a part of a delivery. With a Content-Length it reads
// exactly that much, without waiting for the next part of a stream (which
// is what ends the part otherwise). The length only bounds the read: the
// buffer grows with what arrives, whatever length the part claims.
func readPart(p *multipart.Part) ([]byte, error) {
	n, err := strconv.ParseInt(p.Header.Get("Content-Length"), 10, 64)
	if err != nil || n < 0 || n > 1<<30 {
		return io.ReadAll(p)
	}
	b, err := io.ReadAll(io.LimitReader(p, n))
	if err == nil && int64(len(b)) < n {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

// Subscribe streams a queue's deliveries to fn, one at a time in the order
// the server hands them out, until ctx ends or fn fails (its error is
// returned). While the queue is empty the subscription waits on the server;
// with req.WaitSeconds wire.BlockNoWait it returns nil once nothing is
// ready, or once a stream ended with deliveries fn left unfinished (a
// stream without waiting also ends when its page of unfinished deliveries
// is full; when fn acked or nacked each through Delivery.Ack or Nack,
// another stream is opened). A stream that breaks off (its server crashed
// or restarted), or whose server goes away before it began (shutting down,
// without a leader), is opened again; so is one answered 409 waiting (its
// wait ran out, or a stateful one found the next message's state sidecar
// held: then it asks again a second later). Every delivery is leased like a dequeued
// one: fn acks or nacks it. A delivery that never reaches fn is handed back
// (Delivery.HandBack): one that arrived when ctx ended or after fn failed,
// and one a broken-off stream delivered only in part. One the server sent
// that had not arrived when fn failed stays leased until its lease runs
// out.
func (c *Client) Subscribe(ctx context.Context, req wire.DequeueRequest, fn func(*Delivery) error) error {
	return c.subscribe(ctx, "/v1/queue/subscribe", req, false, fn)
}

// SubscribeWithState is Subscribe with state sidecars (see DequeueWithState).
func (c *Client) SubscribeWithState(ctx context.Context, req wire.DequeueRequest, fn func(*Delivery) error) error {
	return c.subscribe(ctx, "/v1/queue/subscribeWithState", req, true, fn)
}

func (c *Client) subscribe(ctx context.Context, path string, req wire.DequeueRequest, withState bool, fn func(*Delivery) error) error {
	for {
		started := time.Now()
		resp, dr, err := c.openDeliveries(ctx, path, req, withState)
		switch {
		case ctx.Err() != nil:
			if resp != nil {
				// The stream began with a delivery leased to this
				// subscription: hand back what of it arrived (the transport
				// ends the stream, as ctx ended).
				handBackRead(ctx, dr, ctx.Err())
				resp.Body.Close()
			}
			return ctx.Err()
		case errors.Is(err, errcode.Waiting):
			if req.WaitSeconds == wire.BlockNoWait {
				return nil
			}
			if err := sleep(ctx, waitingPause(err)-time.Since(started)); err != nil {
				return err
			}
			continue
		case brokeOff(err):
			// Its server went away before the stream began (restarting,
			// or cut off): the stream is opened again, as after a break.
			if err := pace(ctx, started); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		}
		delivered, finished, err := c.drain(ctx, dr, resp.Body, fn)
		resp.Body.Close()
		if cut(err) {
			// The connection broke (the server crashed or restarted): the
			// stream is opened again, as after its end.
			if err := pace(ctx, started); err != nil {
				return err
			}
			continue
		}
		// Without waiting, a stream also ends once its page of unfinished
		// deliveries is full: when fn finished them, the next one may
		// hold more. One that delivered nothing found nothing ready.
		if err != nil || req.WaitSeconds == wire.BlockNoWait && (delivered == 0 || !finished) {
			return err
		}
	}
}

// pace makes a subscription that opens its stream again take at least
// 100 ms per round, so a server that keeps answering at once (or cutting
// the stream) is not asked in a tight loop.
func pace(ctx context.Context, started time.Time) error {
	return sleep(ctx, 100*time.Millisecond-time.Since(started))
}

// waitingPause is how long a subscription answered 409 waiting (err)
// takes before it asks again, counted from when it asked: a second when
// the answer gives a retry_after_seconds (whole seconds until the wait
// ends, such as the lease on a state sidecar another holder keeps; not
// more, so that an earlier release is not waited out), else the 100 ms of
// pace.
func waitingPause(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.Envelope.RetryAfter > 0 {
		return time.Second
	}
	return 100 * time.Millisecond
}

// streamError is a failure to read a subscription's stream.
type streamError struct{ err error }

func (e *streamError) Error() string { return e.err.Error() }
func (e *streamError) Unwrap() error { return e.err }

// cut reports whether err is a stream that broke off: its connection failed
// or it ended before its closing boundary.
func cut(err error) bool {
	var se *streamError
	return errors.As(err, &se) && connectionLost(err)
}

// connectionLost reports whether err is a connection that failed or a body
// that ended early.
func connectionLost(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// brokeOff reports whether err, the failure to open a stream, is its
// server going away (shutting down, without a leader, the connection
// reset) rather than a refusal or a server that cannot be reached at all.
func brokeOff(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return serverGoingAway(e)
	}
	// Every error of an HTTP call is a net.Error (url.Error): only a
	// failed connection, not a server that speaks no HTTP or a URL no
	// transport takes, is the server going away.
	var op *net.OpError
	if err == nil || refused(err) || errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return errors.As(err, &op) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// drain hands a stream's deliveries to fn until the stream ends; it
// reports how many fn was given, and whether fn finished (acked or
// nacked) every one of them. A delivery leased to the stream that fn will
// not see is handed back: one that arrived in part before the stream broke
// off, one read after ctx ended, and, once fn failed, each that had
// arrived by then (the stream, body, is closed first, so that no more
// come).
func (c *Client) drain(ctx context.Context, dr *deliveryReader, body io.Closer, fn func(*Delivery) error) (n int, finished bool, err error) {
	finished = true
	for ; ; n++ {
		d, err := dr.next()
		switch {
		case err == io.EOF: //nolint:errorlint // next answers the closing boundary with the bare io.EOF
			return n, finished, nil
		case ctx.Err() != nil:
			if d != nil {
				_ = d.HandBack(ctx, ctx.Err())
			}
			if err == nil {
				body.Close()
				handBackRead(ctx, dr, ctx.Err())
			}
			return n, finished, ctx.Err()
		case err != nil:
			if d != nil {
				_ = d.HandBack(ctx, err)
			}
			return n, finished, &streamError{err}
		}
		err = fn(d)
		finished = finished && d.finished.Load()
		if err != nil {
			body.Close()
			handBackRead(ctx, dr, err)
			return n + 1, finished, err
		}
	}
}

// handBackRead hands back every delivery left in what dr had read of its
// stream, whole or in part, because of cause.
func handBackRead(ctx context.Context, dr *deliveryReader, cause error) {
	for {
		d, err := dr.next()
		if d != nil {
			_ = d.HandBack(ctx, cause)
		}
		if err != nil {
			return
		}
	}
}

// Ack acknowledges a delivery. It is retried after an ambiguous failure: a
// retry of an ack that took effect is answered as the first attempt was.
func (c *Client) Ack(ctx context.Context, req wire.AckRequest) (*wire.AckResponse, error) {
	req.Namespace = c.ns(req.Namespace)
	body, _ := json.Marshal(req)
	var out wire.AckResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/queue/ack", body: body, idempotent: true}, &out)
	return &out, err
}

// Nack hands a delivery back to its queue. Like Ack, it is retried after
// an ambiguous failure.
func (c *Client) Nack(ctx context.Context, req wire.NackRequest) (*wire.NackResponse, error) {
	req.Namespace = c.ns(req.Namespace)
	body, _ := json.Marshal(req)
	var out wire.NackResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/queue/nack", body: body, idempotent: true}, &out)
	return &out, err
}

// Extend extends a delivery's lease.
func (c *Client) Extend(ctx context.Context, req wire.ExtendRequest) (*wire.ExtendResponse, error) {
	req.Namespace = c.ns(req.Namespace)
	body, _ := json.Marshal(req)
	var out wire.ExtendResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/queue/extend", body: body, idempotent: true}, &out)
	return &out, err
}

// QueueStats describes a queue without changing it; stale reads the serving
// node's own state without asking the leader.
func (c *Client) QueueStats(ctx context.Context, ns, queue string, stale bool) (*wire.QueueStatsResponse, error) {
	body, _ := json.Marshal(wire.QueueStatsRequest{Namespace: c.ns(ns), Queue: queue})
	var q url.Values
	if stale {
		q = url.Values{"stale": {"1"}}
	}
	var out wire.QueueStatsResponse
	_, err := c.doJSON(ctx, call{method: http.MethodPost, path: "/v1/queue/stats", query: q, body: body, idempotent: true}, &out)
	return &out, err
}
