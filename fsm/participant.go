package fsm

import "github.com/raftlockd/raftlockd/wire"

// A participant names a resource a transaction enlists: a key or a queue
// message. Every kind answers the same questions, so that preparing,
// deciding and applying a transaction never depends on what it commits.
type resource interface {
	// holder names the owner holding the resource for a transaction other
	// than txn; a holder that is owner itself is no conflict.
	holder(txn, owner string) (string, bool)
	// held reports whether txn holds the resource with a hold that ends the
	// transaction when it runs out (a lease, a delivery).
	held(txn string) bool
	// expired reports whether txn's hold on the resource has passed its
	// expiry.
	expired(txn string) bool
	// lock takes the resource for txn as w if nobody holds it.
	lock(txn string, w Waiter)
	// finish carries out the decision on the resource.
	finish(txn string, commit bool)
}

// resource returns the resource a local participant names: a queue
// message when its key has a message's shape ("q/<queue>/msg/<id>", as
// lockd names them; no key of that shape can be acquired), a key otherwise.
func (s *applyState) resource(p Participant) resource {
	if p.Namespace == wire.UTXOParticipantNamespace {
		txid, _ := txidBytes(p.Key)
		return utxoResource{s: s, txid: txid}
	}
	if queue, id, ok := parseMessageKey(p.Key); ok {
		return queueResource{s: s, ns: p.Namespace, queue: queue, id: id, k: msgKey(p.Namespace, queue, id)}
	}
	return keyResource{s: s, ns: p.Namespace, key: p.Key, k: keyOf(p.Namespace, p.Key)}
}

// keyResource is a key: held through its lease, committed by promoting the
// transaction's staged write.
type keyResource struct {
	s       *applyState
	ns, key string
	k       []byte
}

func keyHolder(r reader, k []byte, txn, owner string) (string, bool) {
	rec := r.keyRecord(k)
	l := rec.Lease
	if l == nil || l.TxnID == txn || (owner != "" && l.Owner == owner) {
		return "", false
	}
	return l.Owner, true
}

func (r keyResource) holder(txn, owner string) (string, bool) {
	return keyHolder(r.s.reader, r.k, txn, owner)
}

func (r keyResource) held(txn string) bool {
	rec := r.s.keyRecord(r.k)
	return rec.Lease != nil && rec.Lease.TxnID == txn
}

func (r keyResource) expired(txn string) bool {
	rec := r.s.keyRecord(r.k)
	return rec.Lease != nil && rec.Lease.TxnID == txn && rec.Lease.ExpiresAt <= r.s.now
}

func (r keyResource) lock(txn string, w Waiter) {
	rec := r.s.keyRecord(r.k)
	if rec.Lease != nil {
		if until := r.s.now + w.TTL; rec.Lease.TxnID == txn && rec.Lease.ExpiresAt < until {
			r.s.extendLease(r.k, &rec, until) // a later pending decision extends the hold
		}
		return
	}
	r.s.grant(r.ns, r.key, r.k, &rec, w)
	r.s.putJSON(bucketKeys, r.k, rec)
}

func (r keyResource) finish(txn string, commit bool) {
	rec := r.s.keyRecord(r.k)
	if commit {
		if w, ok := r.s.staged(txn, r.ns, r.key); ok {
			r.s.promote(r.k, &rec, w)
		}
	}
	if rec.Lease != nil && rec.Lease.TxnID == txn {
		r.s.releaseLease(r.k, &rec)
	} else {
		r.s.putJSON(bucketKeys, r.k, rec)
	}
}

// holds reports whether txn holds any of its local participants.
func (s *applyState) holds(txn string, t *TxnRecord) bool {
	held := false
	locals(t.Participants, func(p Participant) bool {
		held = s.resource(p).held(txn)
		return !held
	})
	return held
}

// locals calls fn for each participant of this island.
func locals(ps []Participant, fn func(p Participant) bool) {
	for _, p := range ps {
		if p.Backend == "" && !fn(p) {
			return
		}
	}
}

// expiredIn reports whether txn's hold on one of its local participants
// has passed its expiry.
func (s *applyState) expiredIn(txn string, t *TxnRecord) bool {
	found := false
	if t != nil {
		locals(t.Participants, func(p Participant) bool {
			found = s.resource(p).expired(txn)
			return !found
		})
	}
	return found
}
