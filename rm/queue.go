package rm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// Queues: enqueue, dequeue (waiting on the server for the next message,
// without polling), ack, nack, extend and stats. Deliveries and waiting
// consumers are replicated state; this service validates requests, mints
// identifiers and parks a waiting dequeue until the step that makes a
// message ready hands it over.

// QueueLimits are the server's queue policies.
type QueueLimits struct {
	DefaultVisibility  time.Duration // delivery lease when neither message nor dequeue names one
	MaxVisibility      time.Duration
	DefaultMaxAttempts int
	MaxPayloadBytes    int64
	MaxWait            time.Duration // longest a dequeue waits
	StagedTxnTTL       time.Duration // how long a transaction holding only staged enqueues may stay undecided
}

// Decider ends a transaction that another island coordinates (or that spans
// islands): package tc.
type Decider interface {
	DecideCoordinated(ctx context.Context, txn, home string, commit bool) error
}

// Queues serves queue operations.
type Queues struct {
	store   Store
	waits   *Waits
	clock   Clock
	limits  QueueLimits
	node    Server
	decider Decider
}

// NewQueues wires the queue service of server node; waits must observe the
// state machine store replicates.
func NewQueues(store Store, waits *Waits, clock Clock, limits QueueLimits, node Server, decider Decider) *Queues {
	if limits.DefaultVisibility <= 0 {
		limits.DefaultVisibility = 30 * time.Second
	}
	if limits.MaxVisibility < limits.DefaultVisibility {
		// Never below the default: a request naming a timeout between
		// the two would get less than one that names none.
		limits.MaxVisibility = max(12*time.Hour, limits.DefaultVisibility)
	}
	if limits.DefaultMaxAttempts <= 0 {
		limits.DefaultMaxAttempts = 5
	}
	if limits.MaxPayloadBytes <= 0 {
		limits.MaxPayloadBytes = 1 << 20
	}
	return &Queues{store: store, waits: waits, clock: clock, limits: limits, node: node, decider: decider}
}

// Limits returns the queue policies in force.
func (q *Queues) Limits() QueueLimits { return q.limits }

const maxQueueLen = 128

// QueueName validates a queue name: 1-128 of A-Z, a-z, 0-9, '.', '_', '-',
// not starting with '.'. The dead-letter queue of such a queue,
// "<queue>.dlq", may be longer by its suffix (Enqueue does not take such a
// name: its own dead-letter queue would be longer still).
func QueueName(name string) (string, error) {
	if name == "" {
		return "", errcode.InvalidQueue.With("queue is required")
	}
	limit := maxQueueLen
	if strings.HasSuffix(name, fsm.DeadLetterSuffix) {
		limit += len(fsm.DeadLetterSuffix)
	}
	if len(name) > limit || name[0] == '.' {
		return "", errcode.InvalidQueue.With("queue must be 1-%d characters (a dead-letter queue %d) and not start with '.'",
			maxQueueLen, maxQueueLen+len(fsm.DeadLetterSuffix))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return "", errcode.InvalidQueue.With("queue may only hold A-Z, a-z, 0-9, '.', '_' and '-'")
		}
	}
	return name, nil
}

// QueueRef names a queue.
func QueueRef(ns, queue string) (string, string, error) {
	ns, err := Namespace(ns)
	if err != nil {
		return "", "", err
	}
	queue, err = QueueName(queue)
	return ns, queue, err
}

// validJSON reports whether raw is JSON text in UTF-8: json.Valid and
// json.Compact let invalid UTF-8 in strings through, which would be stored
// and served as JSON that is not.
func validJSON(raw []byte) bool { return utf8.Valid(raw) && json.Valid(raw) }

func seconds(name string, s int64) (time.Duration, error) {
	if s < 0 {
		return 0, errcode.InvalidParams.With("%s must not be negative", name)
	}
	if s > int64(100*365*24*time.Hour/time.Second) {
		return 0, errcode.InvalidParams.With("%s is too large", name)
	}
	return time.Duration(s) * time.Second, nil
}

// EnqueueParams is an enqueue request. Durations are whole seconds on the
// wire; zero means the default.
type EnqueueParams struct {
	Namespace      string
	Queue          string
	Payload        io.Reader
	ContentType    string
	Attributes     json.RawMessage
	DelaySeconds   int64
	VisibilitySecs int64
	TTLSeconds     int64
	MaxAttempts    int
	TxnID          string // the message appears only when this transaction commits
	IdempotencyKey string // a retry with the same key enqueues once
}

// Enqueue adds a message to a queue.
func (q *Queues) Enqueue(ctx context.Context, p EnqueueParams) (*fsm.MessageInfo, error) {
	ns, queue, err := QueueRef(p.Namespace, p.Queue)
	if err != nil {
		return nil, err
	}
	if len(queue) > maxQueueLen {
		return nil, errcode.InvalidQueue.With("a queue to enqueue to must be 1-%d characters", maxQueueLen)
	}
	if err := idempotencyKey(p.IdempotencyKey); err != nil {
		return nil, err
	}
	delay, err := seconds("delay_seconds", p.DelaySeconds)
	if err != nil {
		return nil, err
	}
	vis, err := q.visibility("visibility_timeout_seconds", p.VisibilitySecs)
	if err != nil {
		return nil, err
	}
	ttl, err := seconds("ttl_seconds", p.TTLSeconds)
	if err != nil {
		return nil, err
	}
	attempts := p.MaxAttempts
	switch {
	case attempts < 0:
		return nil, errcode.InvalidParams.With("max_attempts must not be negative")
	case attempts == 0:
		attempts = q.limits.DefaultMaxAttempts
	}
	if len(p.Attributes) > 0 && (!validJSON(p.Attributes) || bytes.TrimSpace(p.Attributes)[0] != '{') {
		return nil, errcode.InvalidBody.With("attributes must be a JSON object")
	}
	if len(p.ContentType) > 256 || !printable(p.ContentType) {
		return nil, errcode.InvalidBody.With("payload_content_type must be printable and at most 256 bytes")
	}
	txn := p.TxnID
	if txn != "" {
		if txn, err = TxnID(txn); err != nil {
			return nil, err
		}
	}
	payload, err := q.readPayload(p.Payload)
	if err != nil {
		return nil, err
	}
	id := xid.New().String()
	if p.IdempotencyKey != "" {
		id = "m-" + digest(ns, queue, p.IdempotencyKey)[:24]
	}
	var compact []byte
	if len(p.Attributes) > 0 {
		var buf bytes.Buffer
		_ = json.Compact(&buf, p.Attributes)
		compact = buf.Bytes()
	}
	res, err := q.store.Propose(ctx, &fsm.Command{Op: fsm.OpEnqueue, Enqueue: &fsm.EnqueueCmd{Namespace: ns, Queue: queue,
		ID: id, ContentType: p.ContentType, Attributes: compact, Delay: delay.Milliseconds(), Visibility: vis.Milliseconds(),
		TTL: ttl.Milliseconds(), MaxAttempts: attempts, TxnID: txn, TxnTTL: q.limits.StagedTxnTTL.Milliseconds(),
		Idempotent: p.IdempotencyKey != "", Payload: payload}})
	if err != nil {
		return nil, err
	}
	return res.Queue.Message, nil
}

func (q *Queues) readPayload(r io.Reader) ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	raw, err := io.ReadAll(io.LimitReader(r, q.limits.MaxPayloadBytes+1))
	if err != nil {
		var e *errcode.Error
		if errors.As(err, &e) {
			return nil, e
		}
		return nil, errcode.InvalidBody.With("reading payload: %v", err)
	}
	if int64(len(raw)) > q.limits.MaxPayloadBytes {
		return nil, errcode.PayloadTooLarge.With("payload exceeds %d bytes", q.limits.MaxPayloadBytes)
	}
	return raw, nil
}

// visibility resolves the lease duration a request gives in field name: 0
// is the default, more than the maximum the maximum.
func (q *Queues) visibility(name string, secs int64) (time.Duration, error) {
	d, err := seconds(name, secs)
	switch {
	case err != nil:
		return 0, err
	case d == 0:
		return q.limits.DefaultVisibility, nil
	case d > q.limits.MaxVisibility:
		return q.limits.MaxVisibility, nil
	}
	return d, nil
}

// DequeueParams is a dequeue request.
type DequeueParams struct {
	Namespace      string
	Queue          string
	Owner          string
	VisibilitySecs int64 // 0: the message's own
	WaitSeconds    int64 // 0: answer at once; capped by the server's maximum
	TxnID          string
	WithState      bool
}

// Delivery is a dequeued message: its metadata and lease, its payload and,
// for a stateful dequeue, the sidecar's committed document.
type Delivery struct {
	Message *fsm.MessageInfo
	Payload []byte
	State   fsm.Doc
}

// Dequeue leases the first ready message of a queue. Without one it waits
// up to WaitSeconds for the step that makes one ready to hand it over, then
// answers queue_empty.
func (q *Queues) Dequeue(ctx context.Context, p DequeueParams) (*Delivery, error) {
	ns, queue, err := QueueRef(p.Namespace, p.Queue)
	if err != nil {
		return nil, err
	}
	own, err := owner(p.Owner)
	if err != nil {
		return nil, err
	}
	var vis time.Duration
	if p.VisibilitySecs != 0 {
		if vis, err = q.visibility("visibility_timeout_seconds", p.VisibilitySecs); err != nil {
			return nil, err
		}
	}
	wait, err := seconds("wait_seconds", p.WaitSeconds)
	if err != nil {
		return nil, err
	}
	wait = min(wait, q.limits.MaxWait)
	txn := p.TxnID
	if txn != "" {
		if txn, err = TxnID(txn); err != nil {
			return nil, err
		}
	}
	req := xid.New().String()
	cmd := &fsm.DequeueCmd{Namespace: ns, Queue: queue, Owner: own, RequestID: req, LeaseID: xid.New().String(),
		Visibility: vis.Milliseconds(), Wait: wait.Milliseconds(), TxnID: txn, Node: q.node.ID, Run: q.node.Run, WithState: p.WithState}
	if p.WithState {
		cmd.StateLease = xid.New().String()
		if txn == "" {
			// Dated by the members' clock, as an acquire's (Keys.Acquire):
			// the consumer may carry it to other islands.
			cmd.StateTxn = xid.NewWithTime(q.clock.Now()).String()
		}
	}
	events, unregister := q.waits.register(req, "", waitDequeue)
	defer func() { unregister() }()
	until := time.Now().Add(wait)
	delivered := func(r *fsm.Result) bool { return r.Queue != nil && r.Queue.Message != nil }
	res, ev, inLine, err := proposeAndWait(ctx, q.store, wait, events, func(left int64) *fsm.Command {
		cmd.Wait = left
		return &fsm.Command{Op: fsm.OpDequeue, Dequeue: cmd}
	}, delivered, func() (*fsm.Result, <-chan fsm.Event, error) {
		// A dequeue proposed again takes the next ready message: the one
		// it may have been handed in the steps the restore covered is
		// found by leaving the line first.
		res, err := q.withdraw(ctx, ns, queue, req, until)
		if err != nil || delivered(res) {
			return res, nil, err
		}
		// Out of line, it stands in it again as a new request: the end of
		// the old one's wait (the withdrawal's) is not taken for its own.
		unregister()
		req = xid.New().String()
		cmd.RequestID = req
		events, unregister = q.waits.register(req, "", waitDequeue)
		return res, events, nil
	})
	switch {
	case err != nil:
		// The dequeue may have been applied all the same (its answer was
		// lost or came too late): a waiting consumer nobody stands behind
		// must leave, and a message it was given must reach the caller,
		// which hands it back when it cannot deliver it. So also without
		// a wait, or the queue would look empty while the message stays
		// leased to nobody.
		if mayStandInLine(res, err) {
			awaitAnswer(ctx, err)
			// Applied, if at all, before the answer that has come by now.
			if res, cerr := q.withdraw(ctx, ns, queue, req, time.Now().Add(wait)); cerr == nil && res.Queue != nil && res.Queue.Message != nil {
				return q.fetch(ctx, res.Queue.Message)
			}
		}
		return nil, err
	case res != nil:
		return q.fetch(ctx, res.Queue.Message)
	case ev != nil && ev.Message != nil:
		return q.fetch(ctx, ev.Message)
	case ev != nil:
		return nil, ev.Err
	}
	// Stop waiting, unless a message arrived meanwhile.
	res, err = q.withdraw(ctx, ns, queue, req, inLine)
	if err != nil {
		return nil, err
	}
	if res.Queue != nil && res.Queue.Message != nil {
		// Delivered before the cancel, and not heard of here yet.
		return q.fetch(ctx, res.Queue.Message)
	}
	select {
	case ev := <-events:
		if ev.Message != nil {
			return q.fetch(ctx, ev.Message)
		}
	default:
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("rm: dequeue %s/%s: %w", ns, queue, ctx.Err())
	}
	return nil, errcode.QueueEmpty.With("no message became ready in %s within %s", queue, wait)
}

// withdraw takes the waiting dequeue req out of the queue's consumers,
// whatever became of ctx; the answer holds the delivery when a message was
// handed to it first. Like a key's (Keys.withdraw), it is sent again while
// no leader takes it, until the request's wait (until) would have run out
// in the replicated state, or a message enqueued after the outage would be
// leased to a consumer that is gone, until its visibility runs out.
func (q *Queues) withdraw(ctx context.Context, ns, queue, req string, until time.Time) (*fsm.Result, error) {
	return proposeUntil(ctx, q.store, &fsm.Command{Op: fsm.OpQCancel,
		QCancel: &fsm.QueueCancelCmd{Namespace: ns, Queue: queue, RequestID: req}}, until.Add(withdrawSlack))
}

// fetch turns a delivery into what the consumer gets: the state machine
// hands the payload and the sidecar's document over with it.
func (q *Queues) fetch(_ context.Context, m *fsm.MessageInfo) (*Delivery, error) {
	d := &Delivery{Message: m, Payload: m.Payload}
	if st := m.State; st != nil {
		d.State = fsm.Doc{Exists: m.StateDoc != nil, Bytes: m.StateDoc, Version: st.Version, ETag: st.ETag, Token: st.Token}
	}
	m.Payload, m.StateDoc = nil, nil
	return d, nil
}

// MessageRef names a delivery as a consumer holds it.
type MessageRef struct {
	Namespace string
	Queue     string
	MessageID string
	LeaseID   string
	Token     int64 // 0: not checked
}

func (r MessageRef) validate() (fsm.MessageRef, error) {
	ns, queue, err := QueueRef(r.Namespace, r.Queue)
	if err != nil {
		return fsm.MessageRef{}, err
	}
	if r.MessageID == "" {
		return fsm.MessageRef{}, errcode.InvalidParams.With("message_id is required")
	}
	if len(r.MessageID) > 64 || !printable(r.MessageID) {
		return fsm.MessageRef{}, errcode.InvalidParams.With("message_id must be 1-64 printable bytes, as a dequeue gives it")
	}
	lease, err := LeaseID(r.LeaseID)
	if err != nil {
		return fsm.MessageRef{}, err
	}
	if r.Token < 0 {
		return fsm.MessageRef{}, errcode.InvalidFencing.With("fencing token must be positive")
	}
	return fsm.MessageRef{Namespace: ns, Queue: queue, ID: r.MessageID, LeaseID: lease, Token: r.Token}, nil
}

// finish proposes an ack or nack; an enlisted delivery whose transaction
// spans islands is decided by its coordinator instead.
func (q *Queues) finish(ctx context.Context, cmd *fsm.Command, commit bool) (*fsm.Result, error) {
	res, err := q.store.Propose(ctx, cmd)
	var e *errcode.Error
	if errors.As(err, &e) && e.Code == errcode.TxnCoordinated.Code && q.decider != nil {
		return &fsm.Result{Released: true}, q.decider.DecideCoordinated(ctx, e.TxnID, e.Home, commit)
	}
	return res, err
}

// Ack acknowledges a delivery: the message (and its sidecar) is removed. A
// delivery enlisted in a transaction is acknowledged by committing it.
func (q *Queues) Ack(ctx context.Context, ref MessageRef) error {
	r, err := ref.validate()
	if err != nil {
		return err
	}
	_, err = q.finish(ctx, &fsm.Command{Op: fsm.OpQAck, QAck: &fsm.QueueAckCmd{MessageRef: r}}, true)
	return err
}

// NackParams says how a delivery goes back.
type NackParams struct {
	Defer        bool // does not count as a failed delivery
	DelaySeconds int64
	LastError    json.RawMessage
}

// Nack returns a delivery to its queue (after the delay), or to the
// dead-letter queue once it failed max_attempts times. A delivery enlisted
// in a transaction is returned by rolling the transaction back.
func (q *Queues) Nack(ctx context.Context, ref MessageRef, p NackParams) (*fsm.QueueResult, error) {
	r, err := ref.validate()
	if err != nil {
		return nil, err
	}
	delay, err := seconds("delay_seconds", p.DelaySeconds)
	if err != nil {
		return nil, err
	}
	if len(p.LastError) > 0 && (!validJSON(p.LastError) || len(p.LastError) > 64<<10) {
		return nil, errcode.InvalidBody.With("last_error must be JSON of at most 64 KiB")
	}
	res, err := q.finish(ctx, &fsm.Command{Op: fsm.OpQNack, QNack: &fsm.QueueNackCmd{MessageRef: r, Defer: p.Defer,
		Delay: delay.Milliseconds(), LastError: p.LastError}}, false)
	if err != nil {
		return nil, err
	}
	if res.Queue == nil {
		// The transaction's coordinator rolled it back, which ended the
		// delivery here: its end record says where the message went.
		return q.deliveryEnd(ctx, r), nil
	}
	return res.Queue, nil
}

// deliveryEnd answers where delivery r went when it ended, from the record
// the step that ended it left; without one (or without a state to read it
// from) the message is taken to be back in its queue.
func (q *Queues) deliveryEnd(ctx context.Context, r fsm.MessageRef) *fsm.QueueResult {
	out := &fsm.QueueResult{Requeued: true}
	read := func(v *fsm.View) error {
		if end, ok := v.DeliveryEnd(r); ok {
			out = end
		}
		return nil
	}
	if err := q.store.Read(ctx, read); err != nil && ctx.Err() == nil {
		_ = q.store.ReadStale(ctx, read)
	}
	return out
}

// Extend extends a delivery's lease (and its sidecar's) to now + by
// seconds (0: the message's visibility timeout).
func (q *Queues) Extend(ctx context.Context, ref MessageRef, bySeconds int64) (*fsm.MessageInfo, error) {
	r, err := ref.validate()
	if err != nil {
		return nil, err
	}
	var by time.Duration
	if bySeconds != 0 {
		if by, err = q.visibility("extend_by_seconds", bySeconds); err != nil {
			return nil, err
		}
	}
	res, err := q.store.Propose(ctx, &fsm.Command{Op: fsm.OpQExtend, QExtend: &fsm.QueueExtendCmd{MessageRef: r,
		By: by.Milliseconds()}})
	if err != nil {
		return nil, err
	}
	return res.Queue.Message, nil
}

// Stats describes a queue without changing it.
func (q *Queues) Stats(ctx context.Context, ns, queue string, c Consistency) (fsm.QueueStats, error) {
	ns, queue, err := QueueRef(ns, queue)
	if err != nil {
		return fsm.QueueStats{}, err
	}
	var st fsm.QueueStats
	read := q.store.Read
	if c == Stale {
		read = q.store.ReadStale
	}
	err = read(ctx, func(v *fsm.View) error {
		st = v.QueueStats(ns, queue)
		return nil
	})
	return st, err
}

// Delivering reports whether the delivery of message id under leaseID has
// not ended, as the leader confirms (a linearizable read): a server that
// cannot reach a leader answers its error.
func (q *Queues) Delivering(ctx context.Context, ns, queue, id, leaseID string) (bool, error) {
	held := false
	err := q.store.Read(ctx, func(v *fsm.View) error {
		held = v.Delivering(ns, queue, id, leaseID)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("rm: delivery %s of %s/%s: %w", leaseID, ns, queue, err)
	}
	return held, nil
}

// WatchDelivery returns a channel that is ready once the delivery of
// message id under leaseID has ended (acknowledged, handed back,
// dead-lettered or dropped) as far as this server has applied, and stop,
// which ends the watch.
func (q *Queues) WatchDelivery(ctx context.Context, ns, queue, id, leaseID string) (<-chan fsm.Event, func(), error) {
	events, stop := q.waits.register(leaseID, "", waitDelivery)
	// Registered first: an end applied after this read is heard of. The
	// read is linearizable: a follower the leader handed the delivery to
	// may not have applied it yet, and would take it for ended. Without a
	// leader to confirm the read, this server's state is all there is: the
	// delivery has ended only when the state records its end, since one
	// this server has not applied yet is missing from it as well (its end,
	// when it comes, is applied after it and heard of).
	held, err := q.Delivering(ctx, ns, queue, id, leaseID)
	if err != nil && ctx.Err() == nil {
		err = q.store.ReadStale(ctx, func(v *fsm.View) error {
			held = v.Delivering(ns, queue, id, leaseID) || !v.DeliveryOver(ns, queue, id, leaseID)
			return nil
		})
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	if !held {
		ended := make(chan fsm.Event, 1)
		ended <- fsm.Event{Kind: fsm.EventDeliveryEnded, RequestID: leaseID}
		return ended, stop, nil
	}
	return events, stop, nil
}
