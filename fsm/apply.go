package fsm

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// applyState is one batch's view of the state file: a bbolt write
// transaction, the replicated clock and the events to publish after commit.
// Every operation checks all of its preconditions before its first write, so
// a rejected command changes nothing.
type applyState struct {
	reader
	now     int64
	seq     uint64
	dirty   bool // now or seq changed
	events  []Event
	backend string // set by this batch
	term    uint64 // Raft term of the entry being applied
	// authChanged is set when the batch changed an access list.
	authChanged bool
	// ustats are the UTXO counters, when the batch read them.
	ustats *UTXOStats
	// nacking is the nack whose transaction's rollback is being applied.
	nacking *pendingNack
	// qcounts are the queue counters the batch changed, by qid.
	qcounts map[string]*queueCounts
}

func beginApply(tx *bolt.Tx) *applyState {
	s := &applyState{reader: reader{tx: tx}}
	meta := s.b(bucketMeta)
	s.now = int64(u64(meta.Get(metaNow)))
	s.seq = u64(meta.Get(metaSeq))
	return s
}

func (s *applyState) appliedIndex() uint64 { return u64(s.b(bucketMeta).Get(metaApplied)) }

func (s *applyState) finish(index, term uint64) {
	meta := s.b(bucketMeta)
	v := putU64(index)
	v = append(v, putU64(term)...)
	must(meta.Put(metaApplied, v))
	if s.ustats != nil {
		s.putJSON(bucketMeta, metaUTXOStats, s.ustats)
	}
	s.flushQueueCounts(index)
	if s.dirty {
		must(meta.Put(metaNow, putU64(uint64(s.now))))
		must(meta.Put(metaSeq, putU64(s.seq)))
	}
}

func (s *applyState) putJSON(bucket, key []byte, v any) {
	raw, err := json.Marshal(v)
	must(err)
	s.put(bucket, key, raw)
}

// putFault, when set, fails the writes to the buckets it reports, as a
// failing disk would: the fault tests use it.
var putFault func(bucket []byte) bool

func (s *applyState) put(bucket, key, val []byte) {
	if putFault != nil && putFault(bucket) {
		must(errors.New("fsm: injected storage fault"))
	}
	s.countQueues(bucket, key, val)
	must(s.b(bucket).Put(key, val))
}

func (s *applyState) del(bucket, key []byte) {
	s.countQueues(bucket, key, nil)
	must(s.b(bucket).Delete(key))
}

func (s *applyState) emit(e Event) { s.events = append(s.events, e) }

// applyEntry applies the command, or the packed commands, of one entry.
func (s *applyState) applyEntry(data []byte) interface{} {
	if len(data) == 0 || data[0] != formatPacked {
		return s.apply(data)
	}
	cmds, err := unpack(data)
	if err != nil {
		return fail(err.(*errcode.Error))
	}
	out := make(Results, len(cmds))
	for i, c := range cmds {
		out[i] = s.apply(c)
	}
	return out
}

// apply runs one encoded command. The replicated clock only moves forward:
// a leader whose wall clock is behind its predecessor's does not rewind it.
// A command of a format newer than this build's was written by a newer
// leader: applying it as malformed would leave this node's state behind
// the others', so the batch fails and the node stops.
func (s *applyState) apply(data []byte) *Result {
	if len(data) > 0 && data[0] > EntryFormat {
		panic(storageFailure{fmt.Errorf("entry format %d is newer than this build's (%d): upgrade this node", data[0], EntryFormat)})
	}
	c, err := Decode(data)
	if err != nil {
		return fail(err.(*errcode.Error))
	}
	if c.Now > s.now {
		s.now = c.Now
		s.dirty = true
	}
	switch c.Op {
	case OpAcquire:
		return s.acquire(c.Acquire)
	case OpCancelWait:
		return s.cancelWait(c.CancelWait)
	case OpKeepAlive:
		return s.keepAlive(c.KeepAlive)
	case OpWrite:
		return s.write(c.Write)
	case OpRelease:
		return s.release(c.Release)
	case OpSweep:
		return s.sweep(c.Sweep)
	case OpNoop:
		return &Result{}
	case OpSetBackend:
		return s.setBackend(c.SetBackend)
	case OpTxnDecide:
		return s.txnDecide(c.Decide)
	case OpTxnPrepare:
		return s.txnPrepare(c.Prepare)
	case OpTxnRMApply:
		return s.txnRMApply(c.RMApply)
	case OpTxnAck:
		return s.txnAck(c.Ack)
	case OpRMRegister:
		return s.rmRegister(c.RMRegister)
	case OpEnqueue:
		return s.enqueue(c.Enqueue)
	case OpDequeue:
		return s.dequeue(c.Dequeue)
	case OpQCancel:
		return s.queueCancel(c.QCancel)
	case OpQAck:
		return s.queueAck(c.QAck)
	case OpQNack:
		return s.queueNack(c.QNack)
	case OpQExtend:
		return s.queueExtend(c.QExtend)
	case OpRevoke:
		return s.revoke(c.Revoke)
	case OpTrust:
		return s.trust(c.Trust)
	case OpUTXOCreate:
		return s.utxoCreate(c.UTXOCreate)
	case OpUTXOSpend:
		return s.utxoSpend(c.UTXOSpend)
	case OpUTXOUpdate:
		return s.utxoUpdate(c.UTXOUpdate)
	case OpUTXOBlock:
		return s.utxoBlock(c.UTXOBlock)
	case OpUTXOPrune:
		return s.utxoPrune(c.UTXOPrune)
	case OpDropWaits:
		return s.dropWaits(c.DropWaits)
	case OpForgetKeys:
		return s.forgetKeys(c.ForgetKeys)
	}
	return fail(errcode.UnknownCmd.With("%q", c.Op))
}

func nonEmpty(fields ...string) bool {
	for _, f := range fields {
		if f == "" {
			return false
		}
	}
	return true
}

func hasNUL(fields ...string) bool {
	for _, f := range fields {
		if strings.IndexByte(f, 0) >= 0 {
			return true
		}
	}
	return false
}

// maxPartBytes bounds each name or identifier that becomes part of a bbolt
// key, so that no composite key reaches bbolt's key size limit (a failed
// Put would stop the node). The HTTP layer allows far less.
const maxPartBytes = 1024

func tooLong(fields ...string) bool {
	for _, f := range fields {
		if len(f) > maxPartBytes {
			return true
		}
	}
	return false
}

// validName rejects what would break the ns\0key layout. The HTTP layer
// applies the user-facing rules; this keeps the state file sound whatever
// reaches the log.
func validName(ns, key string) *errcode.Error {
	if ns == "" || key == "" || hasNUL(ns, key) || tooLong(ns, key) {
		return errcode.MalformedCmd.With("bad namespace or key")
	}
	return nil
}

func (s *applyState) acquire(c *AcquireCmd) *Result {
	if err := validName(c.Namespace, c.Key); err != nil {
		return fail(err)
	}
	if IsMessageKey(c.Key) {
		return fail(errcode.InvalidKey.With("%q names a queue message, not a key", c.Key))
	}
	if !nonEmpty(c.Owner, c.TxnID, c.LeaseID, c.RequestID) || hasNUL(c.TxnID) || tooLong(c.TxnID, c.RequestID) || c.TTL <= 0 || c.Wait < 0 {
		return fail(errcode.MalformedCmd.With("acquire needs owner, txn, lease, request id and a positive ttl"))
	}
	t := s.txn(c.TxnID)
	if t != nil && t.State != TxnPending {
		return fail(decidedErr(t))
	}
	if err := s.doomed(c.TxnID, t); err != nil {
		return fail(err)
	}
	k := keyOf(c.Namespace, c.Key)
	rec := s.keyRecord(k)
	// Another acquire by the transaction holding the key, or a retry of the
	// request that obtained the lease while the lease lasts, gets the
	// existing lease back; a retry finding it expired waits like anyone.
	if l := rec.Lease; l != nil && (l.TxnID == c.TxnID || l.RequestID == c.RequestID && l.ExpiresAt > s.now) {
		return &Result{Lease: leaseInfo(c.Namespace, c.Key, &rec)}
	}
	if wk := s.b(bucketWaitReq).Get([]byte(c.RequestID)); wk != nil {
		// A retry of a queued request. One that will not wait leaves the
		// queue as it is; one that waits takes the queued place over, with
		// its own wait budget, so that the attempt it replaced can no
		// longer withdraw it.
		if c.Wait == 0 {
			return fail(waiting(&rec, s.now, "lease held by another owner"))
		}
		s.takeOver(bytes.Clone(wk), c, s.now+c.Wait)
		return &Result{Queued: true}
	}
	if c.IfNotExists && (rec.State || rec.Lease != nil) {
		e := errcode.AlreadyExists.With("key already exists")
		e.CurrentVersion, e.CurrentETag = rec.Version, rec.ETag
		return fail(e)
	}
	if tooLarge(t, c.Namespace, c.Key) {
		return fail(errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants))
	}
	w := Waiter{RequestID: c.RequestID, LeaseID: c.LeaseID, TxnID: c.TxnID, Owner: c.Owner, TTL: c.TTL}
	if rec.Lease == nil {
		s.grant(c.Namespace, c.Key, k, &rec, w)
		s.putJSON(bucketKeys, k, rec)
		return &Result{Lease: leaseInfo(c.Namespace, c.Key, &rec)}
	}
	if c.Wait == 0 {
		return fail(waiting(&rec, s.now, "lease held by another owner"))
	}
	w.Attempt, w.Node, w.Run = c.Attempt, c.Node, c.Run
	w.Deadline, w.EnqueuedAt = s.now+c.Wait, s.now
	s.addWaiter(k, &rec, w)
	s.putJSON(bucketKeys, k, rec)
	s.emit(Event{Kind: EventTimer, When: w.Deadline})
	return &Result{Queued: true}
}

// doomed refuses more keys to a transaction this island coordinates that
// has a lease which expired: the sweeper has yet to roll it back, and it
// joins nothing meanwhile, neither by acquiring nor by a hand-off.
func (s *applyState) doomed(txn string, t *TxnRecord) *errcode.Error {
	if t != nil && t.Home == "" && s.expiredIn(txn, t) {
		return errcode.TxnRolledBack.With("a lease of the transaction expired, so it rolls back")
	}
	return nil
}

// retryAfter is how many seconds (at least one) remain of the lease on rec.
func retryAfter(rec *KeyRecord, now int64) int64 {
	if rec.Lease == nil {
		return 1
	}
	return max(1, (rec.Lease.ExpiresAt-now+999)/1000)
}

// waiting is the answer to an acquirer that does not (or no longer) wait for
// the key of rec: come back when its holder's lease runs out.
func waiting(rec *KeyRecord, now int64, detail string) *errcode.Error {
	e := errcode.Waiting.With("%s", detail)
	e.RetryAfter = retryAfter(rec, now)
	return e
}

// takeOver gives the queued acquire wk to another attempt c of its
// request, waiting until deadline. It keeps its place in the queue.
func (s *applyState) takeOver(wk []byte, c *AcquireCmd, deadline int64) {
	var w Waiter
	if !s.getJSON(bucketWaiters, wk, &w) {
		return
	}
	s.del(bucketWaitExp, timerKey(w.Deadline, wk))
	w.Attempt, w.Node, w.Run, w.Deadline = c.Attempt, c.Node, c.Run, deadline
	s.putJSON(bucketWaiters, wk, w)
	s.put(bucketWaitExp, timerKey(w.Deadline, wk), nil)
	s.emit(Event{Kind: EventTimer, When: w.Deadline})
}

// MaxParticipants bounds the keys of one transaction, so that deciding it
// (one log entry, applied on every node) stays a bounded amount of work.
const MaxParticipants = 1024

func tooLarge(t *TxnRecord, ns, key string) bool {
	return t != nil && len(t.Participants) >= MaxParticipants && !t.has(ns, key)
}

// grant gives the free key k to w: the fencing counter moves on, the lease's
// expiry is indexed for the sweeper and the key joins w's transaction. The
// caller stores rec.
func (s *applyState) grant(ns, key string, k []byte, rec *KeyRecord, w Waiter) {
	rec.Fencing++
	rec.Lease = &Lease{ID: w.LeaseID, TxnID: w.TxnID, Owner: w.Owner, RequestID: w.RequestID,
		Token: rec.Fencing, TTL: w.TTL, AcquiredAt: s.now, ExpiresAt: s.now + w.TTL}
	s.put(bucketLeaseExp, timerKey(rec.Lease.ExpiresAt, k), nil)
	t := s.txn(w.TxnID)
	if t == nil {
		t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
	}
	if !t.has(ns, key) {
		t.Participants = append(t.Participants, Participant{Namespace: ns, Key: key})
	}
	s.putJSON(bucketTxns, []byte(w.TxnID), t)
	s.emit(Event{Kind: EventTimer, When: rec.Lease.ExpiresAt})
}

// addWaiter queues w on key k, indexed by request, deadline and transaction.
func (s *applyState) addWaiter(k []byte, rec *KeyRecord, w Waiter) {
	s.seq++
	s.dirty = true
	wk := waiterKey(k, s.seq)
	s.putJSON(bucketWaiters, wk, w)
	s.put(bucketWaitReq, []byte(w.RequestID), wk)
	s.put(bucketWaitExp, timerKey(w.Deadline, wk), nil)
	s.put(bucketWaitTxn, txnWaiterKey(w.TxnID, wk), nil)
	rec.Waiters++
}

// removeWaiter deletes a queued acquire and its indexes; the caller adjusts
// the key's count.
func (s *applyState) removeWaiter(wk []byte, w *Waiter) {
	s.del(bucketWaiters, wk)
	s.del(bucketWaitReq, []byte(w.RequestID))
	s.del(bucketWaitExp, timerKey(w.Deadline, wk))
	s.del(bucketWaitTxn, txnWaiterKey(w.TxnID, wk))
}

// txnWaiters lists the queued acquires of txn, on any key.
func (s *applyState) txnWaiters(txn string) [][]byte {
	p := append([]byte(txn), 0)
	var out [][]byte
	c := s.b(bucketWaitTxn).Cursor()
	for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
		out = append(out, bytes.Clone(k[len(p):]))
	}
	return out
}

// endWaiter removes one queued acquire and tells its requester why; a
// requester told to wait no longer learns when the holder's lease runs out.
func (s *applyState) endWaiter(wk []byte, why *errcode.Error) {
	var w Waiter
	if !s.getJSON(bucketWaiters, wk, &w) {
		return
	}
	s.removeWaiter(wk, &w)
	k := waiterOwner(wk)
	rec := s.keyRecord(k)
	rec.Waiters = max(0, rec.Waiters-1)
	s.putJSON(bucketKeys, k, rec)
	if why.Code == errcode.Waiting.Code {
		why.RetryAfter = retryAfter(&rec, s.now)
	}
	s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Attempt: w.Attempt, Err: why})
}

// releaseLease frees k and hands it, in the same step, to the first queued
// acquirer that is still waiting; further requests of the same transaction
// queued on k get the same lease. It stores rec.
func (s *applyState) releaseLease(k []byte, rec *KeyRecord) {
	s.del(bucketLeaseExp, timerKey(rec.Lease.ExpiresAt, k))
	rec.Lease = nil
	ns, key := splitKey(k)
	prefix := waiterPrefix(k)
	// Each waiter passed over is removed: the next is the first after it.
	// Seeking from the queue's start instead would cross the emptied pages
	// of every one removed so far, again for each.
	from := prefix
	for rec.Waiters > 0 {
		wk, raw := s.b(bucketWaiters).Cursor().Seek(from)
		if wk == nil || !bytes.HasPrefix(wk, prefix) {
			rec.Waiters = 0 // the count drifted; the queue is the truth
			break
		}
		wk = bytes.Clone(wk)
		from = wk
		var w Waiter
		must(json.Unmarshal(raw, &w))
		s.removeWaiter(wk, &w)
		rec.Waiters--
		t := s.txn(w.TxnID)
		switch {
		case w.Deadline <= s.now:
			// The key is being handed on; when it is free again is unknown.
			s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Attempt: w.Attempt, Err: waiting(rec, s.now, "acquire timed out")})
			continue
		case t != nil && t.State != TxnPending:
			s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Attempt: w.Attempt, Err: decidedErr(t)})
			continue
		case tooLarge(t, ns, key):
			s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Attempt: w.Attempt, Err: errcode.TxnTooLarge.With("a transaction holds at most %d keys", MaxParticipants)})
			continue
		}
		if err := s.doomed(w.TxnID, t); err != nil {
			s.emit(Event{Kind: EventWaitEnded, RequestID: w.RequestID, Attempt: w.Attempt, Err: err})
			continue
		}
		s.grant(ns, key, k, rec, w)
		info := leaseInfo(ns, key, rec)
		s.emit(Event{Kind: EventGranted, RequestID: w.RequestID, Node: w.Node, Lease: info})
		for _, other := range s.txnWaiters(w.TxnID) {
			if !bytes.Equal(waiterOwner(other), k) {
				continue
			}
			var ow Waiter
			if s.getJSON(bucketWaiters, other, &ow) {
				s.removeWaiter(other, &ow)
				rec.Waiters--
				s.emit(Event{Kind: EventGranted, RequestID: ow.RequestID, Node: ow.Node, Lease: info})
			}
		}
		break
	}
	s.putJSON(bucketKeys, k, rec)
}

func (s *applyState) cancelWait(c *CancelWaitCmd) *Result {
	if err := validName(c.Namespace, c.Key); err != nil {
		return fail(err)
	}
	if c.RequestID == "" {
		return fail(errcode.MalformedCmd.With("cancel needs a request id"))
	}
	k := keyOf(c.Namespace, c.Key)
	rec := s.keyRecord(k)
	if wk := s.b(bucketWaitReq).Get([]byte(c.RequestID)); wk != nil {
		if !bytes.Equal(waiterOwner(wk), k) {
			return fail(errcode.MalformedCmd.With("request %s waits on another key", c.RequestID))
		}
		var w Waiter
		if s.getJSON(bucketWaiters, wk, &w) && w.Attempt != c.Attempt {
			// A retry took the queued place over and is still waiting.
			return &Result{RetryAfter: retryAfter(&rec, s.now)}
		}
		s.endWaiter(bytes.Clone(wk), errcode.Waiting.With("acquire cancelled"))
		return &Result{Cancelled: true, RetryAfter: retryAfter(&rec, s.now)}
	}
	// Not queued any more: it was either granted meanwhile or dropped. A
	// grant whose lease has run out since is not handed to a request that
	// stopped waiting (from format 11 on): the sweep frees the key.
	if rec.Lease != nil && rec.Lease.RequestID == c.RequestID && (rec.Lease.ExpiresAt > s.now || s.rules() < formatV11) {
		return &Result{Lease: leaseInfo(c.Namespace, c.Key, &rec)}
	}
	return &Result{Cancelled: true, RetryAfter: retryAfter(&rec, s.now)}
}

func (s *applyState) keepAlive(c *KeepAliveCmd) *Result {
	if err := validName(c.Namespace, c.Key); err != nil {
		return fail(err)
	}
	if c.TTL < 0 {
		return fail(errcode.MalformedCmd.With("negative ttl"))
	}
	k := keyOf(c.Namespace, c.Key)
	rec := s.keyRecord(k)
	if err := s.checkLease(c.Namespace, c.Key, &rec, c.LeaseID, c.TxnID, c.Token, s.now); err != nil {
		return fail(err)
	}
	if c.TTL > 0 {
		rec.Lease.TTL = c.TTL
	}
	if c.Max > 0 && rec.Lease.TTL > c.Max && s.rules() >= formatV10 {
		rec.Lease.TTL = c.Max
	}
	s.extendLease(k, &rec, s.now+rec.Lease.TTL)
	return &Result{Lease: leaseInfo(c.Namespace, c.Key, &rec)}
}

// extendLease moves the expiry of the lease on key k to until and stores rec.
func (s *applyState) extendLease(k []byte, rec *KeyRecord, until int64) {
	s.del(bucketLeaseExp, timerKey(rec.Lease.ExpiresAt, k))
	rec.Lease.ExpiresAt = until
	s.put(bucketLeaseExp, timerKey(until, k), nil)
	s.putJSON(bucketKeys, k, rec)
	s.emit(Event{Kind: EventTimer, When: until})
}

func (s *applyState) write(c *WriteCmd) *Result {
	if err := validName(c.Namespace, c.Key); err != nil {
		return fail(err)
	}
	if !c.Delete && (c.ETag == "" || len(c.Doc) == 0) {
		return fail(errcode.MalformedCmd.With("update needs a document and its etag"))
	}
	k := keyOf(c.Namespace, c.Key)
	rec := s.keyRecord(k)
	if err := s.checkLease(c.Namespace, c.Key, &rec, c.LeaseID, c.TxnID, c.Token, s.now); err != nil {
		return fail(err)
	}
	version, etag, exists, _ := s.holderView(c.Namespace, c.Key, &rec)
	if c.IfVersion != nil && *c.IfVersion != version {
		e := errcode.VersionConflict.With("version is %d, not %d", version, *c.IfVersion)
		e.CurrentVersion, e.CurrentETag = version, etag
		return fail(e)
	}
	// An ETag condition given as "" asks for no document; builds before
	// format 10 did not check it, and apply it so until the island follows
	// format 10's rules.
	if (c.IfETag != "" || c.IfETagSet && s.rules() >= formatV10) && c.IfETag != etag {
		e := errcode.ETagMismatch.With("state etag does not match")
		e.CurrentVersion, e.CurrentETag = version, etag
		return fail(e)
	}
	txn := rec.Lease.TxnID
	area := staging.In(s.tx)
	// A transaction commits as one new version of each key it wrote.
	next := rec.Version + 1
	if c.Delete {
		if !exists {
			return &Result{Write: &WriteResult{Version: version}}
		}
		must(area.Put(txn, c.Namespace, c.Key, staging.Write{Version: next, Deleted: true, StagedAt: s.now}))
		return &Result{Write: &WriteResult{Version: next, Removed: true}}
	}
	must(area.Put(txn, c.Namespace, c.Key, staging.Write{Version: next, ETag: c.ETag, StagedAt: s.now, Doc: c.Doc}))
	return &Result{Write: &WriteResult{Version: next, ETag: c.ETag, Bytes: int64(len(c.Doc))}}
}

func (s *applyState) release(c *ReleaseCmd) *Result {
	if err := validName(c.Namespace, c.Key); err != nil {
		return fail(err)
	}
	if c.LeaseID == "" {
		return fail(errcode.MalformedCmd.With("release needs a lease id"))
	}
	k := keyOf(c.Namespace, c.Key)
	rec := s.keyRecord(k)
	if l := rec.Lease; l != nil && l.ID == c.LeaseID {
		if c.TxnID != "" && c.TxnID != l.TxnID {
			return fail(errcode.TxnMismatch.With("lease belongs to transaction %s", l.TxnID))
		}
		if c.Token != 0 && c.Token != l.Token {
			// A lease id names one grant, which has one token: the request
			// is confused, and the transaction stays open.
			return fail(errcode.LeaseMismatch.With("fencing token %d is not the lease's %d; transaction %s is still open", c.Token, l.Token, l.TxnID))
		}
		t := s.txn(l.TxnID)
		if res := coordinated(l.TxnID, t); res != nil {
			return res
		}
		if t != nil && t.State != TxnPending {
			// A lease outliving its transaction's decision must not happen;
			// should it, the release frees the key.
			s.releaseLease(k, &rec)
			return &Result{Released: true, Decision: t.State}
		}
		reason := ReasonRelease
		if l.ExpiresAt <= s.now || s.expiredIn(l.TxnID, t) {
			// All or nothing: a transaction with an expired lease cannot commit.
			if !c.Rollback {
				return fail(errcode.TxnRolledBack.With("a lease of the transaction expired, so it rolls back; nothing was committed"))
			}
			reason = ReasonExpired
		}
		decision := s.decide(l.TxnID, !c.Rollback, reason)
		return &Result{Released: true, Decision: decision}
	}
	// The lease is gone. A retried release is answered from the recorded
	// decision, which never changes.
	if c.TxnID == "" {
		return fail(errcode.LeaseRequired.With("lease %s does not hold %s/%s", c.LeaseID, c.Namespace, c.Key))
	}
	t := s.txn(c.TxnID)
	switch {
	case t == nil:
		// Nothing is known of the transaction: its decision was forgotten
		// after the retention period, or it never existed. As in lockd, a
		// release of a lease that is gone is done.
		return &Result{Released: true}
	case t.State == TxnPending:
		return fail(errcode.LeaseMismatch.With("lease %s does not hold %s/%s; transaction %s is still open", c.LeaseID, c.Namespace, c.Key, c.TxnID))
	case t.State == TxnCommit && !c.Rollback, t.State == TxnRollback && c.Rollback:
		return &Result{Released: true, Decision: t.State}
	case t.State == TxnRollback && t.Reason == ReasonExpired:
		return fail(errcode.TxnRolledBack.With("a lease of the transaction expired and it was rolled back; nothing was committed"))
	default:
		return fail(decidedErr(t))
	}
}

// decide records the final decision for txn and applies it to every
// local participant in one step: the transaction's queued acquires leave
// their queues, staged writes are promoted (commit) or dropped (rollback),
// its leases are released and each freed key goes to its next queued
// acquirer. The decision is stored first, so the transaction can never be
// granted a key again. It returns the recorded decision.
func (s *applyState) decide(txn string, commit bool, reason string) string {
	return s.decideFinal(txn, commit, reason, "")
}

// decideFinal is decide with a detail (for example the holder of a
// conflicting lock). A decision of this island's coordinator that other
// islands must apply is queued for fan-out until they all did; any other
// decision only waits out its retention.
func (s *applyState) decideFinal(txn string, commit bool, reason, detail string) string {
	t := s.txn(txn)
	if t == nil {
		t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
	}
	if t.State != TxnPending {
		return t.State
	}
	t.State = TxnRollback
	if commit {
		t.State = TxnCommit
	}
	t.Reason, t.Detail = reason, detail
	t.DecidedAt = s.now
	if t.Home == "" {
		t.TCTerm = s.term
		s.setExpiry(txn, t, 0)
	}
	s.setDoubt(txn, t, 0)
	if t.Home == "" && len(t.Remotes()) > 0 {
		s.put(bucketTxnFanout, timerKey(s.now, []byte(txn)), nil)
		s.emit(Event{Kind: EventFanout, TxnID: txn})
	} else {
		s.retain(txn, t)
	}
	s.putJSON(bucketTxns, []byte(txn), t)
	for _, wk := range s.txnWaiters(txn) {
		s.endWaiter(wk, decidedErr(t))
	}
	locals(t.Participants, func(p Participant) bool {
		s.resource(p).finish(txn, commit)
		return true
	})
	must(staging.In(s.tx).Discard(txn))
	return t.State
}

func (s *applyState) promote(k []byte, rec *KeyRecord, w staging.Write) {
	if w.Deleted {
		s.del(bucketDocs, k)
		rec.State, rec.ETag, rec.Size = false, "", 0
	} else {
		s.put(bucketDocs, k, w.Doc)
		rec.State, rec.ETag, rec.Size = true, w.ETag, int64(len(w.Doc))
	}
	rec.Version = w.Version
	rec.UpdatedAt = s.now
}

// dueKeys returns up to limit keys of a time-ordered index whose time is at
// or before cutoff. They are collected before anything is changed, since
// bbolt cursors must not walk a bucket that is being modified.
func (s *applyState) dueKeys(bucket []byte, cutoff int64, limit int) [][]byte {
	var out [][]byte
	c := s.b(bucket).Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		if when, _ := splitTimer(k); when > cutoff {
			break
		}
		out = append(out, bytes.Clone(k))
	}
	return out
}

func (s *applyState) sweep(c *SweepCmd) *Result {
	if c.Limit <= 0 || c.TxnRetention < 0 || c.Format < 0 || c.Format > EntryFormat {
		return fail(errcode.MalformedCmd.With("sweep needs a positive limit and a known entry format"))
	}
	if c.Format >= formatV13 && s.rules() < formatV13 {
		// Records forgotten before the island noted them were created no
		// later than the retention before now.
		s.forgot(s.now - c.TxnRetention)
	}
	if c.Format > s.rules() {
		s.put(bucketMeta, metaRules, putU64(uint64(c.Format)))
	}
	res := &SweepResult{}
	// Every lease, waiter, participant and record touched costs one unit of
	// the budget, so one sweep entry is a bounded step on every node.
	budget := c.Limit
	waitsFirst := s.rules() >= formatV12
	if waitsFirst {
		// A lease or delivery expired below hands its key or message to the
		// first request still waiting, past every one whose wait is over
		// without counting them: those go first, one unit each.
		budget = s.sweepQueueWaits(s.sweepKeyWaits(budget, res), res)
	}
	// Presumed abort: this coordinator's pending decisions past their expiry.
	for _, tk := range s.dueKeys(bucketTxnExp, s.now, budget) {
		if budget <= 0 {
			break
		}
		budget--
		_, id := splitTimer(tk)
		t := s.txn(string(id))
		if t == nil || t.State != TxnPending || t.Home != "" || t.ExpiresAt > s.now {
			s.del(bucketTxnExp, tk) // stale index entry
			continue
		}
		budget -= len(t.Participants)
		s.decideFinal(string(id), false, ReasonPresumedAbort, "the pending decision expired")
		res.Expired++
	}
	for _, tk := range s.dueKeys(bucketLeaseExp, s.now, budget) {
		if budget <= 0 {
			break
		}
		budget--
		_, k := splitTimer(tk)
		rec := s.keyRecord(k)
		if rec.Lease == nil || rec.Lease.ExpiresAt > s.now {
			s.del(bucketLeaseExp, tk) // stale index entry
			continue
		}
		t := s.txn(rec.Lease.TxnID)
		if t == nil || t.State != TxnPending {
			s.releaseLease(k, &rec) // a lease outliving its decision; free the key
			continue
		}
		if t.Home != "" {
			// A prepared participant keeps its lock until its coordinator
			// decides; its expiry is the moment to ask for the decision.
			s.del(bucketLeaseExp, tk)
			if t.DoubtAt == 0 || t.DoubtAt > s.now {
				s.setDoubt(rec.Lease.TxnID, t, s.now)
				s.storeTxn(rec.Lease.TxnID, t)
			}
			continue
		}
		budget -= len(t.Participants) - 1
		s.decide(rec.Lease.TxnID, false, ReasonExpired)
		res.Expired++
	}

	if !waitsFirst {
		budget = s.sweepKeyWaits(budget, res)
	}
	for _, tk := range s.dueKeys(bucketTxnDone, s.now-c.TxnRetention, max(budget, 0)) {
		budget--
		at, id := splitTimer(tk)
		s.del(bucketTxnDone, tk)
		t := s.txn(string(id))
		if t != nil && t.retainedPast(at) {
			continue // islands were added since: their last ack starts the retention again
		}
		if t != nil && s.rules() >= formatV13 {
			s.forgot(cmp.Or(t.CreatedAt, s.now))
		}
		s.del(bucketTxns, id)
		res.Forgotten++
	}
	budget = s.sweepQueues(budget, c.TxnRetention, !waitsFirst, res)
	budget = s.sweepUTXO(budget, res)
	res.More = budget <= 0
	return &Result{Sweep: res}
}

// sweepKeyWaits ends the queued acquires whose wait is over, one unit of
// the budget each, and returns what is left of it.
func (s *applyState) sweepKeyWaits(budget int, res *SweepResult) int {
	for _, tk := range s.dueKeys(bucketWaitExp, s.now, max(budget, 0)) {
		budget--
		_, wk := splitTimer(tk)
		if s.b(bucketWaiters).Get(wk) == nil {
			s.del(bucketWaitExp, tk)
			continue
		}
		s.endWaiter(wk, errcode.Waiting.With("acquire timed out"))
		res.Abandoned++
	}
	return budget
}

func (s *applyState) setBackend(c *SetBackendCmd) *Result {
	if !c.valid() {
		return fail(errcode.MalformedCmd.With("set_backend needs a hash of 1-128 bytes or a voter count of 1-%d", maxVoters))
	}
	meta := s.b(bucketMeta)
	if c.Hash != "" && meta.Get(metaBackend) == nil {
		s.put(bucketMeta, metaBackend, []byte(c.Hash))
		s.backend = c.Hash
	}
	if c.Voters > 0 && uint64(c.Voters) > u64(meta.Get(metaVoters)) {
		s.put(bucketMeta, metaVoters, putU64(uint64(c.Voters)))
	}
	return &Result{}
}

// valid reports whether setBackend accepts c.
func (c *SetBackendCmd) valid() bool {
	return len(c.Hash) <= 128 && c.Voters >= 0 && c.Voters <= maxVoters && (c.Hash != "" || c.Voters != 0)
}

// maxVoters bounds a recorded voter count.
const maxVoters = 1 << 16
