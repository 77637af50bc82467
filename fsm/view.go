package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
)

// View is a consistent read-only view of the state, valid inside FSM.View.
type View struct {
	reader
}

// Key returns the record of (ns, key) and whether the key was ever used.
func (v *View) Key(ns, key string) (KeyRecord, bool) {
	var rec KeyRecord
	ok := v.getJSON(bucketKeys, keyOf(ns, key), &rec)
	return rec, ok
}

// Delivering reports whether message id of a queue is still leased by the
// delivery leaseID.
func (v *View) Delivering(ns, queue, id, leaseID string) bool {
	var m Message
	if !v.getJSON(bucketQMsgs, msgKey(ns, queue, id), &m) {
		return false
	}
	return m.Lease != nil && m.Lease.ID == leaseID
}

// DeliveryOver reports whether this state records the end of the delivery
// of message id under leaseID (for the decision retention): false both for
// a delivery that goes on and for one this state has not seen begin.
func (v *View) DeliveryOver(ns, queue, id, leaseID string) bool {
	if id == "" || leaseID == "" || validQueue(ns, queue) != nil {
		return false
	}
	return v.b(bucketQEnded).Get(endedKey(msgKey(ns, queue, id), leaseID)) != nil
}

// DeliveryEnd returns where the delivery r names went when it ended (back
// in its queue, to the dead-letter queue, dropped for its time to live), as
// the nack that ended it answers, and whether its end is recorded (for the
// decision retention). A delivery that was acknowledged is not reported.
func (v *View) DeliveryEnd(r MessageRef) (*QueueResult, bool) {
	var end deliveryEnd
	if r.ID == "" || r.LeaseID == "" || validQueue(r.Namespace, r.Queue) != nil ||
		!v.getJSON(bucketQEnded, endedKey(msgKey(r.Namespace, r.Queue, r.ID), r.LeaseID), &end) ||
		end.Acked || (r.Token != 0 && r.Token != end.Token) {
		return nil, false
	}
	return end.outcome(), true
}

// DecideAddsIslands reports whether a decide on a decided transaction adds
// the other islands it names to the record (from rules of format 7 on);
// before that it changes nothing.
func (v *View) DecideAddsIslands() bool { return v.decideAddsIslands() }

// Txn returns the transaction record of id, or nil.
func (v *View) Txn(id string) *TxnRecord { return v.txn(id) }

// Doc is a document as a reader sees it.
type Doc struct {
	Exists  bool
	Bytes   []byte
	Version int64
	ETag    string
	Token   int64 // the reader's fencing token; 0 for public reads
}

// PublicDoc returns the committed document of (ns, key).
func (v *View) PublicDoc(ns, key string) Doc {
	k := keyOf(ns, key)
	rec := v.keyRecord(k)
	d := Doc{Exists: rec.State, Version: rec.Version, ETag: rec.ETag}
	if rec.State {
		d.Bytes = bytes.Clone(v.b(bucketDocs).Get(k))
	}
	return d
}

// LeaseDoc returns the document the holder of leaseID sees at time now: its
// own staged write if it made one, otherwise the committed document.
func (v *View) LeaseDoc(ns, key, leaseID, txnID string, token, now int64) (Doc, error) {
	k := keyOf(ns, key)
	rec := v.keyRecord(k)
	if err := v.checkLease(ns, key, &rec, leaseID, txnID, token, now); err != nil {
		return Doc{}, err
	}
	version, etag, exists, staged := v.holderView(ns, key, &rec)
	d := Doc{Exists: exists, Version: version, ETag: etag, Token: rec.Lease.Token}
	switch {
	case staged != nil && exists:
		d.Bytes = staged.Doc
	case staged == nil && exists:
		d.Bytes = bytes.Clone(v.b(bucketDocs).Get(k))
	}
	return d, nil
}

// NextDeadline returns the earliest time (Unix ms) at which a sweep has work:
// a lease expiry, a queued acquirer's deadline, or a decision record older
// than retention. ok is false when nothing is scheduled.
func (v *View) NextDeadline(retention int64) (when int64, ok bool) {
	consider := func(t int64) {
		if !ok || t < when {
			when, ok = t, true
		}
	}
	for _, b := range [][]byte{bucketLeaseExp, bucketWaitExp, bucketTxnExp, bucketQVis, bucketQTTL, bucketQWaitExp, bucketUTXOExp, bucketTxnStaged} {
		if k, _ := v.b(b).Cursor().First(); k != nil {
			t, _ := splitTimer(k)
			consider(t)
		}
	}
	for _, b := range [][]byte{bucketTxnDone, bucketQEndedAt, bucketQIdemAt} {
		if k, _ := v.b(b).Cursor().First(); k != nil {
			t, _ := splitTimer(k)
			consider(t + retention)
		}
	}
	return when, ok
}

// MaxVoters returns the island's voter high-water mark: the most voters its
// leaders have seen alive at once (0 until recorded).
func (v *View) MaxVoters() int { return int(u64(v.b(bucketMeta).Get(metaVoters))) }

// Counts returns the number of leases held and of acquirers queued.
func (v *View) Counts() (leases, waiters int) {
	leases = v.b(bucketLeaseExp).Stats().KeyN
	// A prepared key's lease leaves the expiry index when it runs out, but
	// the key stays held for the transaction until its coordinator decides;
	// every prepared transaction is in txn_doubt.
	exp := v.b(bucketLeaseExp)
	c := v.b(bucketTxnDoubt).Cursor()
	for tk, _ := c.First(); tk != nil; tk, _ = c.Next() {
		_, id := splitTimer(tk)
		t := v.txn(string(id))
		if t == nil {
			continue
		}
		locals(t.Participants, func(p Participant) bool {
			k := keyOf(p.Namespace, p.Key)
			rec := v.keyRecord(k)
			if rec.Lease != nil && rec.Lease.TxnID == string(id) && exp.Get(timerKey(rec.Lease.ExpiresAt, k)) == nil {
				leases++
			}
			return true
		})
	}
	return leases, v.b(bucketWaiters).Stats().KeyN
}

// Hash digests every bucket's keys and values in order. Two nodes that
// applied the same log return the same hash.
func (v *View) Hash() []byte {
	h := sha256.New()
	c := v.tx.Cursor()
	for name, _ := c.First(); name != nil; name, _ = c.Next() {
		field := func(p []byte) {
			h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(p))))
			h.Write(p)
		}
		field(name)
		bc := v.tx.Bucket(name).Cursor()
		for k, val := bc.First(); k != nil; k, val = bc.Next() {
			field(k)
			field(val)
		}
	}
	return h.Sum(nil)
}

// WaitingRequest is a request the state has waiting on a server: a queued
// acquire of Key, or a dequeue waiting on Queue.
type WaitingRequest struct {
	Namespace string
	Key       string // the key an acquire waits for; "" for a dequeue
	Queue     string // the queue a dequeue waits on; "" for an acquire
	RequestID string
	Attempt   string // the acquire's attempt that holds the place
	Run       string // the server's run the request waits in
}

// WaitingOn lists the requests waiting on server node, in any of its runs:
// the queued acquires, then the waiting dequeues, each in key order.
func (v *View) WaitingOn(node string) []WaitingRequest {
	var out []WaitingRequest
	c := v.b(bucketWaiters).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		var w Waiter
		if json.Unmarshal(raw, &w) == nil && w.Node == node {
			ns, key := splitKey(waiterOwner(k))
			out = append(out, WaitingRequest{Namespace: ns, Key: key, RequestID: w.RequestID, Attempt: w.Attempt, Run: w.Run})
		}
	}
	c = v.b(bucketQWaiters).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		var w QueueWaiter
		if json.Unmarshal(raw, &w) == nil && w.Node == node {
			ns, queue := splitKey(waiterOwner(k))
			out = append(out, WaitingRequest{Namespace: ns, Queue: queue, RequestID: w.RequestID, Run: w.Run})
		}
	}
	return out
}
