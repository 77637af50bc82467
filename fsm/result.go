package fsm

import "github.com/raftlockd/raftlockd/errcode"

// Result is what applying one command produced. Err is set when the command
// was rejected; a rejected command leaves the state untouched.
type Result struct {
	Err       *errcode.Error `json:"err,omitempty"`
	Auth      *AuthInfo      `json:"auth,omitempty"`
	Lease     *LeaseInfo     `json:"lease,omitempty"`
	Queued    bool           `json:"queued,omitempty"`
	Cancelled bool           `json:"cancelled,omitempty"`
	Write     *WriteResult   `json:"write,omitempty"`
	Released  bool           `json:"released,omitempty"`
	Decision  string         `json:"decision,omitempty"`
	Sweep     *SweepResult   `json:"sweep,omitempty"`
	Txn       *TxnInfo       `json:"txn,omitempty"`
	Queue     *QueueResult   `json:"queue,omitempty"`
	RM        *RMInfo        `json:"rm,omitempty"`
	UTXO      *UTXOResult    `json:"utxo,omitempty"`
	Forgotten int            `json:"forgotten,omitempty"` // key records forgotten (ForgetKeysCmd)
	// RetryAfter (seconds) tells an acquirer that stopped waiting when the
	// holder's lease runs out.
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// Error returns the rejection as an error, or nil.
func (r *Result) Error() error {
	if r == nil || r.Err == nil {
		return nil
	}
	return r.Err
}

// LeaseInfo describes a granted lease together with the key's committed state
// at the time of the grant. Times are Unix milliseconds.
type LeaseInfo struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
	LeaseID   string `json:"lease"`
	TxnID     string `json:"txn"`
	Owner     string `json:"owner"`
	Token     int64  `json:"token"`
	ExpiresAt int64  `json:"expires_at"`
	Version   int64  `json:"version"`
	ETag      string `json:"etag,omitempty"`
}

// WriteResult describes a staged write.
type WriteResult struct {
	Version int64  `json:"version"`
	ETag    string `json:"etag,omitempty"`
	Bytes   int64  `json:"bytes"`
	Removed bool   `json:"removed,omitempty"`
}

// SweepResult reports what a sweep did and whether more is already due.
type SweepResult struct {
	Expired   int  `json:"expired"`
	Abandoned int  `json:"abandoned"`
	Forgotten int  `json:"forgotten"`
	More      bool `json:"more"`
}

// EventKind says what happened to a queued acquirer or a timer.
type EventKind int

// Events published after a batch commits.
const (
	// EventGranted: the queued acquire RequestID now holds Lease.
	EventGranted EventKind = iota + 1
	// EventWaitEnded: the queued acquire RequestID left the queue without a
	// lease (deadline, cancellation or its transaction was decided); Err says why.
	EventWaitEnded
	// EventTimer: something becomes due at When (Unix ms).
	EventTimer
	// EventFanout: this island's coordinator decided TxnID and other
	// islands have to apply the decision.
	EventFanout
	// EventDoubt: prepared transaction TxnID will need its coordinator's
	// decision at When unless it arrives first.
	EventDoubt
	// EventDelivered: the waiting dequeue RequestID now holds Message.
	EventDelivered
	// EventDeliveryEnded: the delivery whose lease id is RequestID ended
	// (acknowledged, handed back, dead-lettered or dropped).
	EventDeliveryEnded
	// EventRestored: the state was replaced by a snapshot (an operator's
	// restore, or a catch-up). Whoever waits for an event of a request the
	// old state knew has to ask the new state again.
	EventRestored
)

// Event is a side effect of applying a batch that someone outside the state
// machine may be waiting for. Events are published only after the batch's
// bbolt transaction has committed.
type Event struct {
	Kind      EventKind
	RequestID string
	Attempt   string       // EventWaitEnded: the attempt that was waiting
	Node      string       // EventGranted, EventDelivered: the server where the requester waits
	Message   *MessageInfo // EventDelivered
	Lease     *LeaseInfo
	Err       *errcode.Error
	When      int64
	TxnID     string
}

// Observer receives the events of each committed batch, in order. It is
// called on the apply goroutine and must not block.
type Observer interface {
	Observe(events []Event)
}

func fail(e *errcode.Error) *Result { return &Result{Err: e} }

// Results answers a packed entry (EncodePacked): the result of each of its
// commands, in order.
type Results []*Result

func leaseInfo(ns, key string, rec *KeyRecord) *LeaseInfo {
	l := rec.Lease
	return &LeaseInfo{
		Namespace: ns, Key: key, LeaseID: l.ID, TxnID: l.TxnID, Owner: l.Owner,
		Token: l.Token, ExpiresAt: l.ExpiresAt, Version: rec.Version, ETag: rec.ETag,
	}
}
