package fsm

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// storageFailure aborts a batch: bbolt refused a read or write, or a stored
// record no longer decodes. It is raised as a panic inside the apply
// transaction and turned into a fatal stop by ApplyBatch, because carrying on
// would let this node diverge from the others.
type storageFailure struct{ err error }

func must(err error) {
	if err != nil {
		panic(storageFailure{err})
	}
}

// recoverStorage, deferred, turns the panic of must into the error *err,
// and lets any other panic go on.
func recoverStorage(err *error) {
	if r := recover(); r != nil {
		sf, ok := r.(storageFailure)
		if !ok {
			panic(r)
		}
		*err = sf.err
	}
}

// reader holds the lookups shared by apply (write transactions) and View
// (read transactions).
type reader struct {
	tx *bolt.Tx
}

func (r reader) b(name []byte) *bolt.Bucket {
	b := r.tx.Bucket(name)
	if b == nil {
		must(fmt.Errorf("fsm: bucket %q missing", name))
	}
	return b
}

func (r reader) getJSON(bucket, key []byte, v any) bool {
	raw := r.b(bucket).Get(key)
	if raw == nil {
		return false
	}
	if err := json.Unmarshal(raw, v); err != nil {
		must(fmt.Errorf("fsm: decode %s/%q: %w", bucket, key, err))
	}
	return true
}

// keyRecord is the record of k. A key without one counts its fencing
// tokens from the floor of forgotten keys (ForgetKeysCmd).
func (r reader) keyRecord(k []byte) KeyRecord {
	var rec KeyRecord
	if !r.getJSON(bucketKeys, k, &rec) {
		rec.Fencing = r.keyFloor()
	}
	return rec
}

// rules is the newest entry format whose rules the island follows.
func (r reader) rules() int {
	if v := r.b(bucketMeta).Get(metaRules); v != nil {
		return int(u64(v))
	}
	return formatV1
}

// ChecksEmptyETag reports whether the island's rules (format 10 on) check
// a write's condition naming the empty ETag (WriteCmd.IfETagSet with
// IfETag ""): under older rules such a condition is not checked.
func (r reader) ChecksEmptyETag() bool { return r.rules() >= formatV10 }

// decideAddsIslands reports whether the island's rules (format 7 on) have
// a decide on a decided transaction add the other islands it names.
func (r reader) decideAddsIslands() bool { return r.rules() >= formatV7 }

func (r reader) txn(id string) *TxnRecord {
	if id == "" {
		return nil
	}
	var t TxnRecord
	if !r.getJSON(bucketTxns, []byte(id), &t) {
		return nil
	}
	return &t
}

func (r reader) staged(txn, ns, key string) (staging.Write, bool) {
	w, ok, err := staging.In(r.tx).Get(txn, ns, key)
	must(err)
	return w, ok
}

// checkLease decides whether a request naming leaseID (and optionally txnID
// and a fencing token) speaks for the lease currently held on (ns, key) at
// time now. The order of checks follows lockd: lease, expiry, fencing, txn.
func (r reader) checkLease(ns, key string, rec *KeyRecord, leaseID, txnID string, token, now int64) *errcode.Error {
	l := rec.Lease
	if l == nil || l.ID != leaseID {
		if t := r.txn(txnID); t != nil && t.State == TxnRollback && t.Reason == ReasonExpired && t.has(ns, key) {
			return errcode.LeaseExpired.With("lease expired and its transaction was rolled back")
		}
		return errcode.LeaseRequired.With("lease %s does not hold %s/%s", leaseID, ns, key)
	}
	if l.ExpiresAt <= now {
		return errcode.LeaseExpired.With("lease expired")
	}
	if token != 0 && token != l.Token {
		return errcode.FencingMismatch.With("fencing token %d is not the lease's %d", token, l.Token)
	}
	if txnID != "" && txnID != l.TxnID {
		return errcode.TxnMismatch.With("lease belongs to transaction %s", l.TxnID)
	}
	return nil
}

// holderView is the state a lease holder sees: its own staged write if it
// made one, otherwise the committed state.
func (r reader) holderView(ns, key string, rec *KeyRecord) (version int64, etag string, exists bool, staged *staging.Write) {
	if rec.Lease != nil {
		if w, ok := r.staged(rec.Lease.TxnID, ns, key); ok {
			return w.Version, w.ETag, !w.Deleted, &w
		}
	}
	return rec.Version, rec.ETag, rec.State, nil
}

func decidedErr(t *TxnRecord) *errcode.Error {
	if t.State == TxnCommit {
		return errcode.TxnCommitted.With("transaction already committed")
	}
	return errcode.TxnRolledBack.With("transaction already rolled back (%s)", t.Reason)
}
