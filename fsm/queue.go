package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strings"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// Queues. A queue is named by (namespace, queue); its messages live in the
// replicated state like everything else, so an acknowledged enqueue
// survives any minority of node losses.
//
// A message is ready (in q_ready, in enqueue order) when nothing holds it
// back: no delivery lease, no delay, no transaction that has not committed
// its enqueue. A dequeue leases the first ready message for a visibility
// timeout and gives the delivery a fencing token; ack removes the message,
// nack makes it ready again (after an optional delay), and a lease that
// runs out counts as a failed delivery. A message that failed max_attempts
// times moves to the dead-letter queue "<queue>.dlq" of its namespace. A
// dequeue that finds nothing ready may wait: it joins the queue's FIFO of
// waiting consumers, and the step that makes a message ready hands it to the
// first of them, exactly like a released key goes to its first waiter.
//
// With a state sidecar (dequeueWithState) the delivery also leases the key
// "q/<queue>/state/<message id>" of the namespace; the consumer updates it
// like any key. Ack deletes the sidecar; nack keeps it, with the updates the
// consumer staged.
//
// How each delivery ended (acknowledged, back in the queue, dead-lettered)
// is kept for the decision retention, so that an ack or nack retried after
// its answer was lost (a leader crash, a dropped connection) is answered as
// the first attempt was instead of as a stale delivery.
//
// A dequeue or enqueue that names a transaction enlists the message in it:
// committing acknowledges a dequeued message (and deletes its sidecar) or
// makes an enqueued one visible; rolling back returns a dequeued message to
// the queue (a failed delivery) or drops an enqueued one.

// Buckets of the queues. qid is ns\0queue; a message key is qid\0id.
var (
	bucketQMsgs    = []byte("q_msgs")     // message key -> Message
	bucketQBodies  = []byte("q_bodies")   // message key -> payload
	bucketQReady   = []byte("q_ready")    // qid\0seq(8) -> id
	bucketQVis     = []byte("q_vis")      // when|message key -> nil: delays and delivery leases, by their end
	bucketQTTL     = []byte("q_ttl")      // when|message key -> nil: messages by expiry
	bucketQWaiters = []byte("q_waiters")  // qid\0seq(8) -> QueueWaiter, FIFO per queue
	bucketQWaitReq = []byte("q_wait_req") // request id -> q_waiters key
	bucketQWaitExp = []byte("q_wait_exp") // deadline|q_waiters key -> nil
	bucketQEnded   = []byte("q_ended")    // message key\0lease id -> deliveryEnd
	bucketQEndedAt = []byte("q_ended_at") // ended_at|q_ended key -> nil
	bucketQIdem    = []byte("q_idem")     // message key -> idemRecord: an idempotent enqueue
	bucketQIdemAt  = []byte("q_idem_at")  // enqueued_at|message key -> nil
)

// DeadLetterSuffix names a queue's dead-letter queue: "<queue>.dlq".
const DeadLetterSuffix = ".dlq"

// DefaultStagedTTL (ms) is how long a transaction that holds nothing but
// staged enqueues may stay undecided when the enqueue names no time.
const DefaultStagedTTL = 30_000

// Message is a queued message's metadata. Times are replicated Unix ms.
type Message struct {
	ID          string          `json:"id"`
	Seq         uint64          `json:"seq"`
	EnqueuedAt  int64           `json:"enqueued_at"`
	VisibleAt   int64           `json:"visible_at"`           // not visible before: a delay or the delivery's lease
	ExpiresAt   int64           `json:"expires_at,omitempty"` // dropped after (TTL)
	Visibility  int64           `json:"visibility"`           // default delivery lease, ms
	MaxAttempts int             `json:"max_attempts"`
	Attempts    int             `json:"attempts"`           // deliveries
	Failures    int             `json:"failures,omitempty"` // failed deliveries
	Fencing     int64           `json:"fencing"`            // grows with every delivery
	Attributes  json.RawMessage `json:"attributes,omitempty"`
	ContentType string          `json:"content_type,omitempty"`
	Bytes       int64           `json:"bytes"`
	LastError   json.RawMessage `json:"last_error,omitempty"`
	Lease       *MessageLease   `json:"lease,omitempty"`     // the delivery in flight
	StagedBy    string          `json:"staged_by,omitempty"` // transaction whose enqueue has not committed
	DeadFrom    string          `json:"dead_from,omitempty"` // in a dead-letter queue: the queue it failed in
}

// MessageLease is a delivery in flight.
type MessageLease struct {
	ID        string `json:"id"`
	Owner     string `json:"owner"`
	TxnID     string `json:"txn,omitempty"` // the delivery is enlisted in this transaction
	Token     int64  `json:"token"`
	ExpiresAt int64  `json:"expires_at"`
	State     bool   `json:"state,omitempty"`       // the sidecar is leased with it
	StateID   string `json:"state_lease,omitempty"` // the sidecar's lease
	StateTxn  string `json:"state_txn,omitempty"`   // and its transaction
	Request   string `json:"req,omitempty"`         // the dequeue it was delivered to
	// Nack is how the consumer asked for the delivery back when its
	// transaction spans islands (from format 11 on): the coordinator's
	// rollback requeues the message so.
	Nack *NackNote `json:"nack,omitempty"`
}

// NackNote is a nack waiting for the coordinator's rollback it asked for.
type NackNote struct {
	Defer     bool            `json:"defer,omitempty"`
	Delay     int64           `json:"delay,omitempty"` // milliseconds
	LastError json.RawMessage `json:"last_error,omitempty"`
}

// QueueWaiter is a dequeue waiting for a message.
type QueueWaiter struct {
	RequestID  string `json:"req"`
	Owner      string `json:"owner"`
	LeaseID    string `json:"lease"`
	TxnID      string `json:"txn,omitempty"`
	Visibility int64  `json:"visibility"`
	Deadline   int64  `json:"deadline"`
	Node       string `json:"node,omitempty"`
	Run        string `json:"run,omitempty"`
	WithState  bool   `json:"with_state,omitempty"`
	StateLease string `json:"state_lease,omitempty"`
	StateTxn   string `json:"state_txn,omitempty"`
}

// EnqueueCmd adds a message. ID is minted by the proposer; Payload travels
// after the command's header.
type EnqueueCmd struct {
	Namespace   string          `json:"ns"`
	Queue       string          `json:"queue"`
	ID          string          `json:"id"`
	ContentType string          `json:"content_type,omitempty"`
	Attributes  json.RawMessage `json:"attributes,omitempty"`
	Delay       int64           `json:"delay,omitempty"`   // ms
	Visibility  int64           `json:"visibility"`        // ms, > 0
	TTL         int64           `json:"ttl,omitempty"`     // ms; 0: kept until delivered
	MaxAttempts int             `json:"max_attempts"`      // > 0
	TxnID       string          `json:"txn,omitempty"`     // visible only when this transaction commits
	TxnTTL      int64           `json:"txn_ttl,omitempty"` // ms; how long TxnID, holding nothing else, may stay undecided
	// Idempotent: ID comes from the client's idempotency key. The enqueue
	// is remembered for the decision retention, so that a retry after the
	// message was consumed is answered instead of enqueued again.
	Idempotent bool   `json:"idem,omitempty"`
	Payload    []byte `json:"-"`
}

// DequeueCmd leases the first ready message, or (with Wait) queues the
// caller for the next one.
type DequeueCmd struct {
	Namespace  string `json:"ns"`
	Queue      string `json:"queue"`
	Owner      string `json:"owner"`
	RequestID  string `json:"req"`
	LeaseID    string `json:"lease"`
	Visibility int64  `json:"visibility,omitempty"` // ms; 0: the message's own
	Wait       int64  `json:"wait,omitempty"`       // ms; 0: never waits
	TxnID      string `json:"txn,omitempty"`
	Node       string `json:"node,omitempty"`
	Run        string `json:"run,omitempty"` // the run of the server Node (DropWaitsCmd)
	WithState  bool   `json:"with_state,omitempty"`
	StateLease string `json:"state_lease,omitempty"` // lease id of the sidecar key
	StateTxn   string `json:"state_txn,omitempty"`   // its transaction when the delivery has none
}

// QueueCancelCmd withdraws a waiting dequeue.
type QueueCancelCmd struct {
	Namespace string `json:"ns"`
	Queue     string `json:"queue"`
	RequestID string `json:"req"`
}

// MessageRef names a delivery: the message, its lease and token.
type MessageRef struct {
	Namespace string `json:"ns"`
	Queue     string `json:"queue"`
	ID        string `json:"id"`
	LeaseID   string `json:"lease"`
	Token     int64  `json:"token,omitempty"` // 0: not checked
}

// QueueAckCmd acknowledges a delivery.
type QueueAckCmd struct {
	MessageRef
}

// QueueNackCmd returns a delivery to the queue. Defer does not count as a
// failed delivery.
type QueueNackCmd struct {
	MessageRef
	Defer     bool            `json:"defer,omitempty"`
	Delay     int64           `json:"delay,omitempty"` // ms
	LastError json.RawMessage `json:"last_error,omitempty"`
}

// QueueExtendCmd extends a delivery's lease to now + By.
type QueueExtendCmd struct {
	MessageRef
	By int64 `json:"by,omitempty"` // ms; 0: the message's visibility
}

// MessageInfo describes a message in results and events.
type MessageInfo struct {
	Namespace   string          `json:"ns"`
	Queue       string          `json:"queue"`
	ID          string          `json:"id"`
	EnqueuedAt  int64           `json:"enqueued_at"`
	VisibleAt   int64           `json:"visible_at"`
	Visibility  int64           `json:"visibility"`
	MaxAttempts int             `json:"max_attempts"`
	Attempts    int             `json:"attempts"`
	Failures    int             `json:"failures"`
	Attributes  json.RawMessage `json:"attributes,omitempty"`
	ContentType string          `json:"content_type,omitempty"`
	Bytes       int64           `json:"bytes"`
	Lease       *MessageLease   `json:"lease,omitempty"`
	StagedBy    string          `json:"staged_by,omitempty"`
	// The sidecar's lease when the delivery has one.
	State *LeaseInfo `json:"state,omitempty"`
	// A delivery carries the payload and the sidecar's committed document,
	// so that the server the consumer waits on need not read them.
	Payload  []byte `json:"payload,omitempty"`
	StateDoc []byte `json:"state_doc,omitempty"`
}

// QueueResult is the outcome of a queue command.
type QueueResult struct {
	Message    *MessageInfo `json:"message,omitempty"`
	Queued     bool         `json:"queued,omitempty"`      // the dequeue waits
	Requeued   bool         `json:"requeued,omitempty"`    // nack: ready again (or delayed)
	DeadLetter string       `json:"dead_letter,omitempty"` // nack: moved to this queue
}

func queueID(ns, queue string) []byte {
	k := make([]byte, 0, len(ns)+len(queue)+1)
	k = append(k, ns...)
	k = append(k, 0)
	return append(k, queue...)
}

func msgKey(ns, queue, id string) []byte {
	return append(append(queueID(ns, queue), 0), id...)
}

func splitMsgKey(k []byte) (ns, queue, id string) {
	parts := bytes.SplitN(k, []byte{0}, 3)
	if len(parts) != 3 {
		return "", "", ""
	}
	return string(parts[0]), string(parts[1]), string(parts[2])
}

func seqKey(qid []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(append(bytes.Clone(qid), 0), seq)
}

// MessageKey is the participant key of a queue message, as lockd names it.
func MessageKey(queue, id string) string { return "q/" + queue + "/msg/" + id }

// StateKey is the key of a message's state sidecar, as lockd names it.
func StateKey(queue, id string) string { return "q/" + queue + "/state/" + id }

// IsMessageKey reports whether key has the shape of a message's
// participant key: such a key names the message, never a key.
func IsMessageKey(key string) bool {
	_, _, ok := parseMessageKey(key)
	return ok
}

// IsStateKey reports whether key has the shape of a message's state
// sidecar: such a key is leased with its message, and its record is
// forgotten once the message is gone.
func IsStateKey(key string) bool {
	_, _, ok := parseQueueKey(key, "/state/")
	return ok
}

// parseMessageKey reverses MessageKey.
func parseMessageKey(key string) (queue, id string, ok bool) { return parseQueueKey(key, "/msg/") }

// parseQueueKey reverses MessageKey (kind "/msg/") and StateKey ("/state/").
func parseQueueKey(key, kind string) (queue, id string, ok bool) {
	rest, found := strings.CutPrefix(key, "q/")
	if !found {
		return "", "", false
	}
	i := strings.LastIndex(rest, kind)
	if i <= 0 || i+len(kind) >= len(rest) {
		return "", "", false
	}
	return rest[:i], rest[i+len(kind):], true
}

func (r reader) message(k []byte) *Message {
	var m Message
	if !r.getJSON(bucketQMsgs, k, &m) {
		return nil
	}
	return &m
}

func messageInfo(ns, queue string, m *Message) *MessageInfo {
	info := &MessageInfo{Namespace: ns, Queue: queue, ID: m.ID, EnqueuedAt: m.EnqueuedAt, VisibleAt: m.VisibleAt,
		Visibility: m.Visibility, MaxAttempts: m.MaxAttempts, Attempts: m.Attempts, Failures: m.Failures,
		Attributes: m.Attributes, ContentType: m.ContentType, Bytes: m.Bytes, StagedBy: m.StagedBy}
	if m.Lease != nil {
		l := *m.Lease
		info.Lease = &l
	}
	return info
}

func validQueue(ns, queue string) *errcode.Error {
	if ns == "" || queue == "" || hasNUL(ns, queue) || tooLong(ns, queue) {
		return errcode.MalformedCmd.With("bad namespace or queue")
	}
	return nil
}

func (s *applyState) nextSeq() uint64 {
	s.seq++
	s.dirty = true
	return s.seq
}

func (s *applyState) storeMessage(k []byte, m *Message) { s.putJSON(bucketQMsgs, k, m) }

// settle files message m (already stored or about to be) where it belongs
// now: held by a lease or a delay (q_vis), or ready, in which case the
// queue's first waiting consumer gets it in this same step. A message that
// is neither leased nor staged and whose time to live has passed is dropped
// instead; settle then reports false.
func (s *applyState) settle(ns, queue string, k []byte, m *Message) bool {
	if m.ExpiresAt != 0 && m.Lease == nil && m.StagedBy == "" {
		if m.ExpiresAt <= s.now {
			// Its time ran out while it was leased or staged.
			s.dropMessage(k, m)
			return false
		}
		// The sweep drops the message once it is due (it set a leased or
		// staged message's entry aside until now).
		s.put(bucketQTTL, timerKey(m.ExpiresAt, k), nil)
	}
	switch {
	case m.StagedBy != "":
	case m.Lease != nil || m.VisibleAt > s.now:
		s.put(bucketQVis, timerKey(max(m.VisibleAt, m.leaseEnd()), k), nil)
		s.emit(Event{Kind: EventTimer, When: max(m.VisibleAt, m.leaseEnd())})
	default:
		s.put(bucketQReady, seqKey(queueID(ns, queue), m.Seq), []byte(m.ID))
		s.storeMessage(k, m)
		s.handToWaiter(ns, queue)
		return true
	}
	s.storeMessage(k, m)
	return true
}

func (m *Message) leaseEnd() int64 {
	if m.Lease == nil {
		return 0
	}
	return m.Lease.ExpiresAt
}

// unsettle takes message m out of q_ready and q_vis.
func (s *applyState) unsettle(ns, queue string, k []byte, m *Message) {
	s.del(bucketQReady, seqKey(queueID(ns, queue), m.Seq))
	s.del(bucketQVis, timerKey(max(m.VisibleAt, m.leaseEnd()), k))
}

func (s *applyState) enqueue(c *EnqueueCmd) *Result {
	if err := validQueue(c.Namespace, c.Queue); err != nil {
		return fail(err)
	}
	if c.ID == "" || hasNUL(c.ID) || tooLong(c.ID, c.TxnID) || c.Visibility <= 0 || c.MaxAttempts <= 0 || c.Delay < 0 || c.TTL < 0 || c.TxnTTL < 0 ||
		hasNUL(c.TxnID) || (len(c.Attributes) > 0 && !json.Valid(c.Attributes)) {
		return fail(errcode.MalformedCmd.With("enqueue needs an id, a positive visibility and max attempts"))
	}
	k := msgKey(c.Namespace, c.Queue, c.ID)
	if m := s.message(k); m != nil {
		// A retry of an enqueue whose answer was lost.
		return &Result{Queue: &QueueResult{Message: messageInfo(c.Namespace, c.Queue, m)}}
	}
	if first := s.enqueuedBefore(c, k); first != nil {
		return first
	}
	var t *TxnRecord
	if c.TxnID != "" {
		if t = s.txn(c.TxnID); t != nil && t.State != TxnPending {
			return fail(decidedErr(t))
		}
		if t == nil {
			t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
		}
		if tooMany(t, []Participant{{Namespace: c.Namespace, Key: MessageKey(c.Queue, c.ID)}}) {
			return fail(errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants))
		}
	}
	m := &Message{ID: c.ID, Seq: s.nextSeq(), EnqueuedAt: s.now, VisibleAt: s.now + c.Delay, Visibility: c.Visibility,
		MaxAttempts: c.MaxAttempts, Attributes: c.Attributes, ContentType: c.ContentType, Bytes: int64(len(c.Payload)),
		StagedBy: c.TxnID}
	if c.TTL > 0 {
		m.ExpiresAt = s.now + c.TTL
		s.put(bucketQTTL, timerKey(m.ExpiresAt, k), nil)
		s.emit(Event{Kind: EventTimer, When: m.ExpiresAt})
	}
	s.put(bucketQBodies, k, c.Payload)
	if t != nil {
		mergeParticipants(t, []Participant{{Namespace: c.Namespace, Key: MessageKey(c.Queue, c.ID)}})
		if t.Home == "" {
			ttl := c.TxnTTL
			if ttl <= 0 {
				ttl = DefaultStagedTTL
			}
			s.setStagedUntil(c.TxnID, t, max(t.StagedUntil, s.now+ttl))
		}
		s.storeTxn(c.TxnID, t)
	}
	s.settle(c.Namespace, c.Queue, k, m)
	if c.Idempotent {
		s.putJSON(bucketQIdem, k, idemRecord{At: s.now, Txn: c.TxnID})
		s.put(bucketQIdemAt, timerKey(s.now, k), nil)
	}
	return &Result{Queue: &QueueResult{Message: messageInfo(c.Namespace, c.Queue, m)}}
}

// idemRecord remembers an idempotent enqueue for the decision retention:
// when it was applied, and the transaction it was staged in.
type idemRecord struct {
	At  int64  `json:"at"`
	Txn string `json:"txn,omitempty"`
}

// enqueuedBefore answers a retry of an idempotent enqueue whose message is
// gone (acked, dead-lettered, dropped) as the first attempt was answered
// (the retry carries the same request), unless the transaction it was
// staged in rolled it back.
func (s *applyState) enqueuedBefore(c *EnqueueCmd, k []byte) *Result {
	var first idemRecord
	if !c.Idempotent || !s.getJSON(bucketQIdem, k, &first) {
		return nil
	}
	if first.Txn != "" {
		if t := s.txn(first.Txn); t != nil && t.State == TxnRollback {
			return fail(errcode.TxnRolledBack.With("transaction %s, which enqueued message %s, rolled back", first.Txn, c.ID))
		}
	}
	return &Result{Queue: &QueueResult{Message: &MessageInfo{Namespace: c.Namespace, Queue: c.Queue, ID: c.ID,
		EnqueuedAt: first.At, VisibleAt: first.At + c.Delay, Visibility: c.Visibility, MaxAttempts: c.MaxAttempts,
		ContentType: c.ContentType, Bytes: int64(len(c.Payload)), StagedBy: first.Txn}}}
}

func (s *applyState) dequeue(c *DequeueCmd) *Result {
	if err := validQueue(c.Namespace, c.Queue); err != nil {
		return fail(err)
	}
	if !nonEmpty(c.Owner, c.RequestID, c.LeaseID) || c.Visibility < 0 || c.Wait < 0 || hasNUL(c.TxnID, c.StateTxn) ||
		tooLong(c.RequestID, c.TxnID, c.StateTxn, c.LeaseID, c.StateLease) ||
		(c.WithState && (c.StateLease == "" || (c.TxnID == "" && c.StateTxn == ""))) {
		return fail(errcode.MalformedCmd.With("dequeue needs an owner, a request id and a lease id"))
	}
	if c.TxnID != "" {
		if t := s.txn(c.TxnID); t != nil && t.State != TxnPending {
			return fail(decidedErr(t))
		}
	}
	if wk := s.b(bucketQWaitReq).Get([]byte(c.RequestID)); wk != nil {
		return &Result{Queue: &QueueResult{Queued: true}} // a retry of a waiting dequeue
	}
	w := QueueWaiter{RequestID: c.RequestID, Owner: c.Owner, LeaseID: c.LeaseID, TxnID: c.TxnID, Visibility: c.Visibility,
		Node: c.Node, Run: c.Run, WithState: c.WithState, StateLease: c.StateLease, StateTxn: c.StateTxn}
	qid := queueID(c.Namespace, c.Queue)
	if rk, id := s.firstReady(qid); rk != nil {
		if err := s.deliverable(c.Namespace, c.Queue, id, w); err != nil {
			return fail(err)
		}
		info := s.deliver(c.Namespace, c.Queue, id, w)
		return &Result{Queue: &QueueResult{Message: info}}
	}
	if c.Wait == 0 {
		return fail(errcode.QueueEmpty.With("no message is ready in %s", c.Queue))
	}
	w.Deadline = s.now + c.Wait
	wk := seqKey(qid, s.nextSeq())
	s.putJSON(bucketQWaiters, wk, w)
	s.put(bucketQWaitReq, []byte(w.RequestID), wk)
	s.put(bucketQWaitExp, timerKey(w.Deadline, wk), nil)
	s.emit(Event{Kind: EventTimer, When: w.Deadline})
	return &Result{Queue: &QueueResult{Queued: true}}
}

// firstReady returns the first ready message of queue qid.
func (r reader) firstReady(qid []byte) ([]byte, string) {
	p := append(bytes.Clone(qid), 0)
	k, v := r.b(bucketQReady).Cursor().Seek(p)
	if k == nil || !bytes.HasPrefix(k, p) {
		return nil, ""
	}
	return bytes.Clone(k), string(v)
}

// deliverable checks that w can take message id (a transaction that is
// full, a sidecar held by someone else).
func (s *applyState) deliverable(ns, queue, id string, w QueueWaiter) *errcode.Error {
	if w.WithState {
		// A lease is an obstacle until it ends. One that outlived its
		// transaction's decision is not: deliver frees the key. An expired
		// one whose transaction is undecided is, until the sweep rolls that
		// transaction back as a whole (or, prepared for another island's
		// coordinator, until the coordinator decides): ending the lease here
		// would drop the transaction's write to the sidecar and leave the
		// rest of it free to commit.
		if rec := s.keyRecord(keyOf(ns, StateKey(queue, id))); rec.Lease != nil && s.leaseHolds(&rec) {
			e := errcode.Waiting.With("the state sidecar of message %s is held by %s", id, rec.Lease.Owner)
			e.RetryAfter = retryAfter(&rec, s.now)
			return e
		}
	}
	if w.TxnID != "" {
		if t := s.txn(w.TxnID); t != nil && tooMany(t, []Participant{{Namespace: ns, Key: MessageKey(queue, id)},
			{Namespace: ns, Key: StateKey(queue, id)}}) {
			return errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants)
		}
	}
	return nil
}

// leaseHolds reports whether the lease of rec still keeps its key from others:
// it has not run out, acquirers wait for the key (ending it hands the key to
// the first), or its transaction is undecided.
func (s *applyState) leaseHolds(rec *KeyRecord) bool {
	if rec.Lease.ExpiresAt > s.now || rec.Waiters > 0 {
		return true
	}
	t := s.txn(rec.Lease.TxnID)
	return t != nil && t.State == TxnPending
}

// deliver leases ready message id to w: a new fencing token, the lease until
// now + visibility, the sidecar's lease with it, enlistment in w's
// transaction. The caller has checked deliverable.
func (s *applyState) deliver(ns, queue, id string, w QueueWaiter) *MessageInfo {
	k := msgKey(ns, queue, id)
	m := s.message(k)
	s.unsettle(ns, queue, k, m)
	vis := w.Visibility
	if vis <= 0 {
		vis = m.Visibility
	}
	m.Attempts++
	m.Fencing++
	if uint64(m.Fencing) > u64(s.b(bucketMeta).Get(metaMsgTokens)) {
		s.put(bucketMeta, metaMsgTokens, putU64(uint64(m.Fencing)))
	}
	m.Lease = &MessageLease{ID: w.LeaseID, Owner: w.Owner, TxnID: w.TxnID, Token: m.Fencing, ExpiresAt: s.now + vis,
		Request: w.RequestID}
	m.VisibleAt = m.Lease.ExpiresAt
	info := messageInfo(ns, queue, m)
	if w.TxnID != "" {
		t := s.txn(w.TxnID)
		if t == nil {
			t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
		}
		mergeParticipants(t, []Participant{{Namespace: ns, Key: MessageKey(queue, id)}})
		s.storeTxn(w.TxnID, t)
	}
	if w.WithState {
		// The sidecar is a key: leased like one, for as long as the message.
		txn := w.TxnID
		if txn == "" {
			txn = w.StateTxn
		}
		sk := keyOf(ns, StateKey(queue, id))
		rec := s.keyRecord(sk)
		if rec.Lease != nil {
			// A lease outliving its transaction's decision (deliverable
			// refused any other).
			s.releaseLease(sk, &rec)
			rec = s.keyRecord(sk)
		}
		if rec.Lease == nil {
			s.grant(ns, StateKey(queue, id), sk, &rec, Waiter{LeaseID: w.StateLease, TxnID: txn, Owner: w.Owner, TTL: vis})
			s.putJSON(bucketKeys, sk, rec)
			m.Lease.State, m.Lease.StateID, m.Lease.StateTxn = true, w.StateLease, txn
		}
		info.State = leaseInfo(ns, StateKey(queue, id), &rec)
		if rec.State {
			info.StateDoc = bytes.Clone(s.b(bucketDocs).Get(sk))
		}
	}
	info.Payload = bytes.Clone(s.b(bucketQBodies).Get(k))
	s.settle(ns, queue, k, m)
	return info
}

// endLease ends the lease on key k without a decision of its transaction:
// the transaction's staged write there is dropped and the key is freed.
func (s *applyState) endLease(k []byte, rec *KeyRecord) {
	ns, key := splitKey(k)
	must(staging.In(s.tx).Delete(rec.Lease.TxnID, ns, key))
	s.releaseLease(k, rec)
}

// handToWaiter gives the first ready message of a queue to its first
// waiting consumer that can take it, if any.
func (s *applyState) handToWaiter(ns, queue string) {
	qid := queueID(ns, queue)
	p := append(bytes.Clone(qid), 0)
	from := p // as in releaseLease: after the last waiter passed over
	for {
		wk, raw := s.b(bucketQWaiters).Cursor().Seek(from)
		if wk == nil || !bytes.HasPrefix(wk, p) {
			return
		}
		rk, id := s.firstReady(qid)
		if rk == nil {
			return
		}
		wk = bytes.Clone(wk)
		from = wk
		var w QueueWaiter
		must(json.Unmarshal(raw, &w))
		s.removeQueueWaiter(wk, &w)
		if w.Deadline <= s.now {
			s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Err: errcode.QueueEmpty.With("no message within the wait")})
			continue
		}
		if w.TxnID != "" {
			if t := s.txn(w.TxnID); t != nil && t.State != TxnPending {
				s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Err: decidedErr(t)})
				continue
			}
		}
		if err := s.deliverable(ns, queue, id, w); err != nil {
			s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Err: err})
			continue
		}
		info := s.deliver(ns, queue, id, w)
		s.emit(Event{Kind: EventDelivered, RequestID: w.RequestID, Node: w.Node, Message: info})
		return // deliver settled the rest
	}
}

func (s *applyState) removeQueueWaiter(wk []byte, w *QueueWaiter) {
	s.del(bucketQWaiters, wk)
	s.del(bucketQWaitReq, []byte(w.RequestID))
	s.del(bucketQWaitExp, timerKey(w.Deadline, wk))
}

func (s *applyState) queueCancel(c *QueueCancelCmd) *Result {
	if err := validQueue(c.Namespace, c.Queue); err != nil {
		return fail(err)
	}
	if c.RequestID == "" {
		return fail(errcode.MalformedCmd.With("cancel needs a request id"))
	}
	wk := s.b(bucketQWaitReq).Get([]byte(c.RequestID))
	if wk == nil {
		// Delivered meanwhile (the answer carries the delivery, which the
		// caller may not have heard of yet), or gone.
		if m := s.deliveredTo(c.Namespace, c.Queue, c.RequestID); m != nil {
			return &Result{Queue: &QueueResult{Message: m}}
		}
		return &Result{Cancelled: true}
	}
	wk = bytes.Clone(wk)
	var w QueueWaiter
	if s.getJSON(bucketQWaiters, wk, &w) {
		s.removeQueueWaiter(wk, &w)
		s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Err: errcode.QueueEmpty.With("dequeue cancelled")})
	}
	return &Result{Cancelled: true}
}

// delivery finds the delivery ref names, checking lease and token.
func (s *applyState) delivery(r MessageRef) ([]byte, *Message, *errcode.Error) {
	k, m, err := s.heldDelivery(r)
	if err == nil && m.Lease.ExpiresAt <= s.now {
		err = errcode.QueueLeaseMismatch.With("the delivery's lease of message %s expired", r.ID)
	}
	return k, m, err
}

// heldDelivery is delivery without the expiry check: a delivery prepared
// for another island's coordinator stays held past its lease.
func (s *applyState) heldDelivery(r MessageRef) ([]byte, *Message, *errcode.Error) {
	if err := validQueue(r.Namespace, r.Queue); err != nil {
		return nil, nil, err
	}
	if r.ID == "" || r.LeaseID == "" {
		return nil, nil, errcode.MalformedCmd.With("needs a message id and a lease id")
	}
	k := msgKey(r.Namespace, r.Queue, r.ID)
	m := s.message(k)
	switch {
	case m == nil:
		return nil, nil, errcode.QueueMessageNotFound.With("no message %s in %s", r.ID, r.Queue)
	case m.Lease == nil || m.Lease.ID != r.LeaseID:
		return nil, nil, errcode.QueueLeaseMismatch.With("message %s is not leased by %s", r.ID, r.LeaseID)
	case r.Token != 0 && r.Token != m.Lease.Token:
		return nil, nil, errcode.QueueLeaseMismatch.With("fencing token %d is not the delivery's %d", r.Token, m.Lease.Token)
	}
	return k, m, nil
}

// finishable finds the delivery an ack or nack names: an enlisted delivery
// whose transaction spans islands goes to its coordinator whatever its
// lease, any other must be unexpired.
func (s *applyState) finishable(r MessageRef) ([]byte, *Message, *Result) {
	k, m, err := s.heldDelivery(r)
	if err != nil {
		return nil, nil, fail(err)
	}
	if m.Lease.TxnID != "" {
		if res := coordinated(m.Lease.TxnID, s.txn(m.Lease.TxnID)); res != nil {
			return nil, nil, res
		}
	}
	if txn, ok := s.sidecarTxn(r.Namespace, r.Queue, m); ok && txn != m.Lease.TxnID && isCoordinated(s.txn(txn)) {
		// The sidecar's own transaction, which an ack or a nack decides:
		// not when another island's coordinator decides it (nor is the
		// ack or nack that coordinator's decision to take).
		return nil, nil, fail(errcode.TxnPending.With("the sidecar of message %s is held by transaction %s, which spans islands: its coordinator decides it first", r.ID, txn))
	}
	if m.Lease.ExpiresAt <= s.now {
		return nil, nil, fail(errcode.QueueLeaseMismatch.With("the delivery's lease of message %s expired", r.ID))
	}
	return k, m, nil
}

// coordinated refuses to decide transaction id (record t) here when it
// spans islands: its coordinator decides it.
func coordinated(id string, t *TxnRecord) *Result {
	if isCoordinated(t) {
		e := errcode.TxnCoordinated.With("transaction %s spans islands; its coordinator decides it", id)
		e.Home, e.TxnID = t.Home, id
		return fail(e)
	}
	return nil
}

// isCoordinated reports whether t is undecided and spans islands.
func isCoordinated(t *TxnRecord) bool {
	return t != nil && t.State == TxnPending && (t.Home != "" || len(t.Remotes()) > 0)
}

// sidecarTxn returns the transaction holding the sidecar of delivery m, when
// the delivery still holds its sidecar.
func (s *applyState) sidecarTxn(ns, queue string, m *Message) (string, bool) {
	if m.Lease == nil || !m.Lease.State {
		return "", false
	}
	rec := s.keyRecord(keyOf(ns, StateKey(queue, m.ID)))
	if rec.Lease == nil || rec.Lease.ID != m.Lease.StateID {
		return "", false
	}
	return rec.Lease.TxnID, true
}

func (s *applyState) queueAck(c *QueueAckCmd) *Result {
	k, m, res := s.finishable(c.MessageRef)
	if res != nil {
		if end, ok := s.deliveryEnded(c.MessageRef); ok && end.Acked {
			return &Result{Released: true, Queue: &QueueResult{}} // a retry
		}
		return res
	}
	info := messageInfo(c.Namespace, c.Queue, m)
	if m.Lease.TxnID != "" {
		// An enlisted delivery is acknowledged by committing its
		// transaction, with everything else it holds.
		if s.expiredIn(m.Lease.TxnID, s.txn(m.Lease.TxnID)) {
			return fail(errcode.TxnRolledBack.With("a lease of transaction %s expired, so it rolls back; nothing was acknowledged", m.Lease.TxnID))
		}
		s.decide(m.Lease.TxnID, true, ReasonRelease)
		return &Result{Released: true, Queue: &QueueResult{Message: info}}
	}
	s.ack(c.Namespace, c.Queue, k, m)
	return &Result{Released: true, Queue: &QueueResult{Message: info}}
}

// ack removes a delivered message, and its sidecar with it.
func (s *applyState) ack(ns, queue string, k []byte, m *Message) {
	s.unsettle(ns, queue, k, m)
	s.endDelivery(k, m.Lease, deliveryEnd{Acked: true})
	if m.Lease != nil && m.Lease.State {
		sk := keyOf(ns, StateKey(queue, m.ID))
		rec := s.keyRecord(sk)
		switch {
		case rec.Lease == nil || rec.Lease.ID != m.Lease.StateID:
			// The delivery no longer holds its sidecar.
		case rec.Lease.TxnID != m.Lease.TxnID:
			// The sidecar's own transaction: what it staged goes with it.
			s.decide(rec.Lease.TxnID, false, ReasonRelease)
			rec = s.keyRecord(sk)
		default:
			s.endLease(sk, &rec)
			rec = s.keyRecord(sk)
		}
		if rec.State && (rec.Lease == nil || rec.Lease.ID == m.Lease.StateID) {
			s.dropDoc(sk, &rec)
		}
	} else if s.rules() >= formatV9 {
		// A delivery without the state lease (a plain dequeue of a message
		// an earlier stateful delivery, or its dead-letter move, gave a
		// sidecar): the sidecar lives as long as its message.
		s.carrySidecar(ns, queue, "", m.ID, nil)
	}
	s.dropMessage(k, m)
}

// dropDoc deletes the committed document of key k, whose record is rec.
func (s *applyState) dropDoc(k []byte, rec *KeyRecord) {
	s.del(bucketDocs, k)
	rec.State, rec.ETag, rec.Size, rec.Version, rec.UpdatedAt = false, "", 0, rec.Version+1, s.now
	s.putJSON(bucketKeys, k, *rec)
}

// carrySidecar takes the state sidecar of message id of queue from along
// when the message leaves from (from format 6 on, metaRules): its committed
// document moves to the sidecar of id in queue to (the dead-letter queue),
// or is deleted when to is "" (the message is gone). lease is the delivery
// that just ended, if any: a hold of its own on the sidecar ends with it,
// as its transaction decided. A sidecar that someone else holds (or a
// transaction that another island's coordinator decides), or a dead-letter
// sidecar that is held, stays where it is.
func (s *applyState) carrySidecar(ns, from, to, id string, lease *MessageLease) {
	if s.rules() < formatV6 {
		return
	}
	sk := keyOf(ns, StateKey(from, id))
	rec := s.keyRecord(sk)
	if rec.Lease != nil && lease != nil && lease.State && rec.Lease.ID == lease.StateID {
		if t := s.txn(rec.Lease.TxnID); t == nil || t.State != TxnPending {
			keyResource{s: s, ns: ns, key: StateKey(from, id), k: sk}.finish(rec.Lease.TxnID, t != nil && t.State == TxnCommit)
			rec = s.keyRecord(sk)
		}
	}
	if rec.Lease != nil || !rec.State {
		return
	}
	if to == "" {
		s.dropDoc(sk, &rec)
		return
	}
	tk := keyOf(ns, StateKey(to, id))
	trec := s.keyRecord(tk)
	if trec.Lease != nil {
		return
	}
	s.put(bucketDocs, tk, bytes.Clone(s.b(bucketDocs).Get(sk)))
	trec.State, trec.ETag, trec.Size, trec.Version, trec.UpdatedAt = true, rec.ETag, rec.Size, trec.Version+1, s.now
	s.putJSON(bucketKeys, tk, trec)
	s.dropDoc(sk, &rec)
}

// deliveryEnd records how a delivery ended, for retries of the ack or nack
// that ended it.
type deliveryEnd struct {
	Token      int64  `json:"token"`
	Acked      bool   `json:"acked,omitempty"`
	Nacked     bool   `json:"nacked,omitempty"`      // by its consumer (not its lease running out)
	DeadLetter string `json:"dead_letter,omitempty"` // moved there (a nack, or an expiry, past max attempts)
	Dropped    bool   `json:"dropped,omitempty"`     // its time to live had passed
}

func endedKey(k []byte, leaseID string) []byte {
	ek := make([]byte, 0, len(k)+1+len(leaseID))
	ek = append(ek, k...)
	ek = append(ek, 0)
	return append(ek, leaseID...)
}

// endDelivery records how the delivery under lease l of message k ended.
func (s *applyState) endDelivery(k []byte, l *MessageLease, end deliveryEnd) {
	if l == nil {
		return
	}
	end.Token = l.Token
	ek := endedKey(k, l.ID)
	s.putJSON(bucketQEnded, ek, end)
	s.put(bucketQEndedAt, timerKey(s.now, ek), nil)
	s.emit(Event{Kind: EventDeliveryEnded, RequestID: l.ID})
}

// deliveryEnded finds how the delivery r names ended, if it has.
func (s *applyState) deliveryEnded(r MessageRef) (deliveryEnd, bool) {
	var end deliveryEnd
	if r.ID == "" || r.LeaseID == "" || validQueue(r.Namespace, r.Queue) != nil {
		return end, false
	}
	if !s.getJSON(bucketQEnded, endedKey(msgKey(r.Namespace, r.Queue, r.ID), r.LeaseID), &end) {
		return end, false
	}
	return end, r.Token == 0 || r.Token == end.Token
}

func (s *applyState) dropMessage(k []byte, m *Message) {
	if m.ExpiresAt != 0 {
		s.del(bucketQTTL, timerKey(m.ExpiresAt, k))
	}
	s.del(bucketQMsgs, k)
	s.del(bucketQBodies, k)
}

func (s *applyState) queueNack(c *QueueNackCmd) *Result {
	if c.Delay < 0 || (len(c.LastError) > 0 && !json.Valid(c.LastError)) {
		return fail(errcode.MalformedCmd.With("bad delay or last error"))
	}
	k, m, fin := s.finishable(c.MessageRef)
	if fin != nil {
		if end, ok := s.deliveryEnded(c.MessageRef); ok && end.Nacked {
			// A retry: answered with where the first attempt put the message.
			return &Result{Released: true, Queue: end.outcome()}
		}
		if fin.Err.Code == errcode.TxnCoordinated.Code && s.rules() >= formatV11 {
			// The coordinator's rollback, which the nack asks for next,
			// requeues the message as the nack asks (queueResource.finish).
			if k, m, err := s.heldDelivery(c.MessageRef); err == nil {
				m.Lease.Nack = &NackNote{Defer: c.Defer, Delay: c.Delay, LastError: c.LastError}
				s.storeMessage(k, m)
			}
		}
		return fin
	}
	if m.Lease.TxnID != "" {
		// The rollback ends the delivery (queueResource.finish, requeue);
		// it ended because its consumer nacked it, and from format 9 on
		// the message is requeued as the nack asks.
		if s.rules() >= formatV9 {
			s.nacking = &pendingNack{k: k, cmd: c}
			defer func() { s.nacking = nil }()
		}
		s.decide(m.Lease.TxnID, false, ReasonRelease)
		end, _ := s.markNacked(k, c.MessageRef)
		res := end.outcome()
		if m := s.message(k); m != nil && res.Requeued {
			res.Message = messageInfo(c.Namespace, c.Queue, m)
		}
		return &Result{Released: true, Queue: res}
	}
	res := s.requeue(c.Namespace, c.Queue, k, m, true, !c.Defer, c.Delay, c.LastError)
	return &Result{Released: true, Queue: res}
}

// markNacked records that the delivery r names, which has just ended,
// ended because its consumer nacked it, and returns how it ended.
func (s *applyState) markNacked(k []byte, r MessageRef) (deliveryEnd, bool) {
	end, ok := s.deliveryEnded(r)
	if ok {
		end.Nacked = true
		s.putJSON(bucketQEnded, endedKey(k, r.LeaseID), end)
	}
	return end, ok
}

// outcome reports where a nack that ended the delivery put the message.
func (e deliveryEnd) outcome() *QueueResult {
	return &QueueResult{Requeued: e.DeadLetter == "" && !e.Dropped, DeadLetter: e.DeadLetter}
}

// requeue ends a delivery: the message is ready again after delay, or, when
// the delivery failed for the last allowed time, moves to the dead-letter
// queue. A sidecar keeps the updates the consumer staged when it ended the
// delivery itself (nacked), and drops them when the delivery's lease ran out.
func (s *applyState) requeue(ns, queue string, k []byte, m *Message, nacked, failed bool, delay int64, lastError json.RawMessage) *QueueResult {
	s.unsettle(ns, queue, k, m)
	if txn, ok := s.sidecarTxn(ns, queue, m); ok && txn != m.Lease.TxnID && !isCoordinated(s.txn(txn)) {
		// The sidecar's own transaction, which may outlive the delivery (a
		// keepalive of the sidecar's lease). One another island's
		// coordinator decides keeps the sidecar until it does.
		if nacked {
			s.decide(txn, true, ReasonRelease)
		} else {
			s.decide(txn, false, ReasonExpired)
		}
	}
	lease := m.Lease
	m.Lease = nil
	if failed {
		m.Failures++
		if len(lastError) > 0 {
			m.LastError = lastError
		}
	}
	m.VisibleAt = s.now + delay
	to, tk, end := queue, k, deliveryEnd{Nacked: nacked}
	if failed && m.Failures >= m.MaxAttempts && m.DeadFrom == "" {
		to = queue + DeadLetterSuffix
		body := bytes.Clone(s.b(bucketQBodies).Get(k))
		s.dropMessage(k, m)
		tk = msgKey(ns, to, m.ID)
		if old := s.message(tk); old != nil {
			// An earlier message with this id died too: the newer one
			// takes its place, and its delivery, when it is in flight,
			// ends (from format 11 on).
			s.unsettle(ns, to, tk, old)
			s.dropMessage(tk, old)
			if s.rules() >= formatV11 {
				s.endDelivery(tk, old.Lease, deliveryEnd{Dropped: true})
			}
			s.carrySidecar(ns, to, "", m.ID, nil)
		}
		m.Seq, m.VisibleAt, m.DeadFrom = s.nextSeq(), s.now, queue
		s.put(bucketQBodies, tk, body)
		s.carrySidecar(ns, queue, to, m.ID, lease)
		end.DeadLetter = to
	}
	if !s.settle(ns, to, tk, m) {
		s.carrySidecar(ns, to, "", m.ID, lease)
		s.endDelivery(k, lease, deliveryEnd{Dropped: true, Nacked: nacked})
		return &QueueResult{}
	}
	s.endDelivery(k, lease, end)
	if end.DeadLetter != "" {
		return &QueueResult{DeadLetter: to, Message: messageInfo(ns, to, m)}
	}
	return &QueueResult{Requeued: true, Message: messageInfo(ns, to, m)}
}

func (s *applyState) queueExtend(c *QueueExtendCmd) *Result {
	if c.By < 0 {
		return fail(errcode.MalformedCmd.With("negative extension"))
	}
	k, m, err := s.delivery(c.MessageRef)
	if err != nil {
		return fail(err)
	}
	by := c.By
	if by == 0 {
		by = m.Visibility
	}
	return &Result{Queue: &QueueResult{Message: s.extendDelivery(c.Namespace, c.Queue, k, m, s.now+by)}}
}

// extendDelivery moves the end of message m's delivery lease, and of its
// sidecar's lease with it, to until.
func (s *applyState) extendDelivery(ns, queue string, k []byte, m *Message, until int64) *MessageInfo {
	s.unsettle(ns, queue, k, m)
	m.Lease.ExpiresAt = until
	m.VisibleAt = until
	info := messageInfo(ns, queue, m)
	if m.Lease.State {
		sk := keyOf(ns, StateKey(queue, m.ID))
		rec := s.keyRecord(sk)
		if rec.Lease != nil && rec.Lease.ID == m.Lease.StateID {
			s.extendLease(sk, &rec, until)
			info.State = leaseInfo(ns, StateKey(queue, m.ID), &rec)
		}
	}
	s.settle(ns, queue, k, m)
	return info
}

// sweepQueues does what is due in the queues with up to budget units of
// work: delays that ended (the message becomes ready), delivery leases that
// ran out (a failed delivery, or the expiry of its transaction), messages
// past their TTL, and waiting dequeues past their deadline.
func (s *applyState) sweepQueues(budget int, retention int64, waits bool, res *SweepResult) int {
	// A transaction whose staged enqueues are all it has is rolled back
	// once their hold ends; one with a pending decision or a lease of its
	// own ends with those.
	for _, tk := range s.dueKeys(bucketTxnStaged, s.now, max(budget, 0)) {
		if budget <= 0 {
			break
		}
		budget--
		s.del(bucketTxnStaged, tk)
		_, id := splitTimer(tk)
		t := s.txn(string(id))
		if t == nil || t.State != TxnPending || t.Home != "" || t.StagedUntil > s.now || t.ExpiresAt != 0 || s.holds(string(id), t) {
			continue
		}
		budget -= len(t.Participants)
		s.decideFinal(string(id), false, ReasonExpired, "nothing decided the transaction of its staged enqueues in time")
		res.Expired++
	}
	for _, tk := range s.dueKeys(bucketQVis, s.now, max(budget, 0)) {
		if budget <= 0 {
			break
		}
		budget--
		s.del(bucketQVis, tk)
		_, k := splitTimer(tk)
		ns, queue, _ := splitMsgKey(k)
		m := s.message(k)
		if m == nil || m.StagedBy != "" || max(m.VisibleAt, m.leaseEnd()) > s.now {
			continue // stale index entry
		}
		if m.Lease == nil {
			s.settle(ns, queue, k, m) // the delay ended
			continue
		}
		res.Expired++
		if txn := m.Lease.TxnID; txn != "" {
			t := s.txn(txn)
			switch {
			case t != nil && t.State == TxnPending && t.Home != "":
				// Prepared for a coordinator elsewhere: held until it
				// decides; its expiry is the moment to ask.
				if t.DoubtAt == 0 || t.DoubtAt > s.now {
					s.setDoubt(txn, t, s.now)
					s.storeTxn(txn, t)
				}
				continue
			case t != nil && t.State == TxnPending:
				budget -= len(t.Participants)
				s.decide(txn, false, ReasonExpired)
				continue
			}
		}
		s.requeue(ns, queue, k, m, false, true, 0, nil)
	}
	for _, tk := range s.dueKeys(bucketQTTL, s.now, max(budget, 0)) {
		budget--
		_, k := splitTimer(tk)
		m := s.message(k)
		if m == nil || m.ExpiresAt > s.now {
			s.del(bucketQTTL, tk)
			continue
		}
		if m.Lease != nil || m.StagedBy != "" {
			// Delivered or not yet committed: settle files the entry again
			// when that ends.
			s.del(bucketQTTL, tk)
			continue
		}
		ns, queue, id := splitMsgKey(k)
		s.unsettle(ns, queue, k, m)
		s.dropMessage(k, m)
		s.carrySidecar(ns, queue, "", id, nil)
		res.Forgotten++
	}
	if waits {
		budget = s.sweepQueueWaits(budget, res)
	}
	for _, b := range [][2][]byte{{bucketQEndedAt, bucketQEnded}, {bucketQIdemAt, bucketQIdem}} {
		for _, tk := range s.dueKeys(b[0], s.now-retention, max(budget, 0)) {
			budget--
			_, rk := splitTimer(tk)
			s.del(b[0], tk)
			s.del(b[1], rk)
		}
	}
	return budget
}

// sweepQueueWaits ends the waiting dequeues whose wait is over, one unit of
// the budget each, and returns what is left of it.
func (s *applyState) sweepQueueWaits(budget int, res *SweepResult) int {
	for _, tk := range s.dueKeys(bucketQWaitExp, s.now, max(budget, 0)) {
		budget--
		_, wk := splitTimer(tk)
		var w QueueWaiter
		if !s.getJSON(bucketQWaiters, wk, &w) {
			s.del(bucketQWaitExp, tk)
			continue
		}
		s.removeQueueWaiter(wk, &w)
		s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Err: errcode.QueueEmpty.With("no message within the wait")})
		res.Abandoned++
	}
	return budget
}

// queueResource is a queue message taking part in a transaction: one it
// dequeued (a delivery) or one it enqueued (staged until commit).
type queueResource struct {
	s             *applyState
	ns, queue, id string
	k             []byte
}

func (r queueResource) holder(txn, owner string) (string, bool) {
	m := r.s.message(r.k)
	switch {
	case m == nil:
		return "", false
	case m.StagedBy != "" && m.StagedBy != txn:
		return "txn " + m.StagedBy, true
	case m.Lease != nil && m.Lease.TxnID != txn && (owner == "" || m.Lease.Owner != owner):
		return m.Lease.Owner, true
	}
	return "", false
}

func (r queueResource) held(txn string) bool {
	m := r.s.message(r.k)
	return m != nil && m.Lease != nil && m.Lease.TxnID == txn
}

func (r queueResource) expired(txn string) bool {
	m := r.s.message(r.k)
	return m != nil && m.Lease != nil && m.Lease.TxnID == txn && m.Lease.ExpiresAt <= r.s.now
}

// lock delivers a ready message to txn (a prepare of a message the
// transaction names but has not dequeued).
func (r queueResource) lock(txn string, w Waiter) {
	m := r.s.message(r.k)
	if m != nil && m.Lease != nil && m.Lease.TxnID == txn && m.Lease.ExpiresAt < r.s.now+w.TTL {
		r.s.extendDelivery(r.ns, r.queue, r.k, m, r.s.now+w.TTL) // a later pending decision extends the hold
		return
	}
	if m == nil || m.Lease != nil || m.StagedBy != "" || m.VisibleAt > r.s.now {
		return
	}
	r.s.deliver(r.ns, r.queue, r.id, QueueWaiter{Owner: w.Owner, LeaseID: w.LeaseID, TxnID: txn, Visibility: w.TTL})
}

func (r queueResource) finish(txn string, commit bool) {
	m := r.s.message(r.k)
	switch {
	case m == nil:
	case m.StagedBy == txn && commit:
		m.StagedBy = ""
		r.s.settle(r.ns, r.queue, r.k, m)
	case m.StagedBy == txn:
		r.s.unsettle(r.ns, r.queue, r.k, m)
		r.s.dropMessage(r.k, m)
	case m.Lease != nil && m.Lease.TxnID == txn && commit:
		r.s.ack(r.ns, r.queue, r.k, m)
	case m.Lease != nil && m.Lease.TxnID == txn:
		if n := r.s.nacking; n != nil && bytes.Equal(n.k, r.k) {
			r.s.requeue(r.ns, r.queue, r.k, m, false, !n.cmd.Defer, n.cmd.Delay, n.cmd.LastError)
			return
		}
		if n := m.Lease.Nack; n != nil {
			// The rollback a nack asked the coordinator for.
			ref := MessageRef{Namespace: r.ns, Queue: r.queue, ID: m.ID, LeaseID: m.Lease.ID}
			r.s.requeue(r.ns, r.queue, r.k, m, false, !n.Defer, n.Delay, n.LastError)
			r.s.markNacked(r.k, ref)
			return
		}
		r.s.requeue(r.ns, r.queue, r.k, m, false, true, 0, nil)
	}
}

// pendingNack is the nack of a delivery enlisted in a transaction, whose
// rollback it is applying: the rollback requeues message k as cmd asks.
type pendingNack struct {
	k   []byte
	cmd *QueueNackCmd
}

// MessageBody returns the payload of a message.
func (v *View) MessageBody(ns, queue, id string) []byte {
	return bytes.Clone(v.b(bucketQBodies).Get(msgKey(ns, queue, id)))
}

// QueueStats describes a queue: its head, how many of its messages are
// ready, in flight (leased), delayed and staged by a transaction, and how
// many dequeues wait.
type QueueStats struct {
	Head      *MessageInfo // first ready message
	Ready     int
	InFlight  int
	Delayed   int
	Staged    int
	Waiting   int
	DeadReady int // ready messages in the dead-letter queue
}

// QueueStats describes a queue from its counters (q_counts) and its first
// ready message. A state without counters up to date, which an open counts
// anew, is walked.
func (v *View) QueueStats(ns, queue string) QueueStats {
	if !countsCurrent(v.tx) {
		return v.queueStatsWalk(ns, queue)
	}
	b := v.b(bucketQCounts)
	qid := queueID(ns, queue)
	c := decodeQueueCounts(b.Get(qid))
	dead := decodeQueueCounts(b.Get(queueID(ns, queue+DeadLetterSuffix)))
	st := QueueStats{Ready: int(c.Ready), InFlight: int(c.Leased), Staged: int(c.Staged),
		Delayed: int(c.Msgs - c.Ready - c.Leased - c.Staged), Waiting: int(c.Waiting), DeadReady: int(dead.Ready)}
	if _, id := v.firstReady(qid); id != "" {
		if m := v.message(msgKey(ns, queue, id)); m != nil {
			st.Head = messageInfo(ns, queue, m)
		}
	}
	return st
}

// queueStatsWalk is QueueStats by a walk over the queue.
func (v *View) queueStatsWalk(ns, queue string) QueueStats {
	var st QueueStats
	qid := queueID(ns, queue)
	p := append(bytes.Clone(qid), 0)
	c := v.b(bucketQReady).Cursor()
	for k, id := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, id = c.Next() {
		if st.Ready == 0 {
			if m := v.message(msgKey(ns, queue, string(id))); m != nil {
				st.Head = messageInfo(ns, queue, m)
			}
		}
		st.Ready++
	}
	mc := v.b(bucketQMsgs).Cursor()
	for k, raw := mc.Seek(p); k != nil && bytes.HasPrefix(k, p); k, raw = mc.Next() {
		var m Message
		must(json.Unmarshal(raw, &m))
		switch {
		case m.StagedBy != "":
			st.Staged++
		case m.Lease != nil:
			st.InFlight++
		case m.VisibleAt > 0 && !v.isReady(qid, m.Seq):
			st.Delayed++
		}
	}
	wc := v.b(bucketQWaiters).Cursor()
	for k, _ := wc.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = wc.Next() {
		st.Waiting++
	}
	dp := append(queueID(ns, queue+DeadLetterSuffix), 0)
	dc := v.b(bucketQReady).Cursor()
	for k, _ := dc.Seek(dp); k != nil && bytes.HasPrefix(k, dp); k, _ = dc.Next() {
		st.DeadReady++
	}
	return st
}

func (r reader) isReady(qid []byte, seq uint64) bool {
	return r.b(bucketQReady).Get(seqKey(qid, seq)) != nil
}

// deliveredTo finds the message of a queue currently delivered to dequeue
// request req (a walk over the queue's messages). Only a record holding
// req's field as putJSON writes it is decoded, so that a cancel of a dequeue
// the queue never had waiting, in a queue of many messages, does not stall
// the log.
func (s *applyState) deliveredTo(ns, queue, req string) *MessageInfo {
	enc, err := json.Marshal(req)
	must(err)
	field := append([]byte(`"req":`), enc...)
	p := append(queueID(ns, queue), 0)
	c := s.b(bucketQMsgs).Cursor()
	for k, raw := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, raw = c.Next() {
		if !bytes.Contains(raw, field) {
			continue
		}
		var m Message
		must(json.Unmarshal(raw, &m))
		if m.Lease != nil && m.Lease.Request == req {
			info := messageInfo(ns, queue, &m)
			info.Payload = bytes.Clone(s.b(bucketQBodies).Get(k))
			if m.Lease.State {
				sk := keyOf(ns, StateKey(queue, m.ID))
				if rec := s.keyRecord(sk); rec.Lease != nil && rec.Lease.ID == m.Lease.StateID {
					info.State = leaseInfo(ns, StateKey(queue, m.ID), &rec)
					if rec.State {
						info.StateDoc = bytes.Clone(s.b(bucketDocs).Get(sk))
					}
				}
			}
			return info
		}
	}
	return nil
}
