package fsm

import (
	"bytes"
	"encoding/json"

	"github.com/raftlockd/raftlockd/errcode"
)

// A key record is kept for its fencing counter. One that no longer says
// anything else (no lease, no queued acquirer, no document now or ever) is
// forgotten by ForgetKeysCmd, and its counter goes into the island's floor
// (metaKeyTokens): a key without a record starts counting from the floor,
// so a forgotten key's next token is still above every token it was given.
// Without this the state would grow with every key ever used, and with
// every key-less acquire.

// KeyName names a key of a namespace.
type KeyName struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
}

// ForgetKeysCmd forgets the records of Keys that are still forgettable when
// it is applied (the leader lists them from its view; a key acquired since
// is kept).
type ForgetKeysCmd struct {
	Keys []KeyName `json:"keys"`
}

// MaxForget bounds the keys of one ForgetKeysCmd.
const MaxForget = 4096

// forgettable reports whether rec, the record of k, holds nothing but its
// fencing counter: its version matters only while a document may follow,
// which for a message's state sidecar ends with the message.
func (r reader) forgettable(k []byte, rec *KeyRecord) bool {
	if rec.Lease != nil || rec.Waiters != 0 || rec.State || rec.Version != 0 && !r.orphanSidecar(k) {
		return false
	}
	// The waiter count can drift; the queue is the truth.
	prefix := waiterPrefix(k)
	wk, _ := r.b(bucketWaiters).Cursor().Seek(prefix)
	return wk == nil || !bytes.HasPrefix(wk, prefix)
}

// orphanSidecar reports whether k is the state sidecar of a message that is
// gone (acknowledged, dropped or moved to its dead-letter queue, whose
// deliveries have sidecars of their own).
func (r reader) orphanSidecar(k []byte) bool {
	ns, key := splitKey(k)
	queue, id, ok := parseQueueKey(key, "/state/")
	return ok && r.b(bucketQMsgs).Get(msgKey(ns, queue, id)) == nil
}

// keyFloor is the highest fencing token of a forgotten key record.
func (r reader) keyFloor() int64 { return int64(u64(r.b(bucketMeta).Get(metaKeyTokens))) }

func (s *applyState) forgetKeys(c *ForgetKeysCmd) *Result {
	if len(c.Keys) == 0 || len(c.Keys) > MaxForget {
		return fail(errcode.MalformedCmd.With("forget_keys takes 1 to %d keys", MaxForget))
	}
	for _, n := range c.Keys {
		if err := validName(n.Namespace, n.Key); err != nil {
			return fail(err)
		}
	}
	floor := s.keyFloor()
	forgotten := 0
	for _, n := range c.Keys {
		k := keyOf(n.Namespace, n.Key)
		var rec KeyRecord
		if !s.getJSON(bucketKeys, k, &rec) || !s.forgettable(k, &rec) {
			continue
		}
		s.del(bucketKeys, k)
		floor = max(floor, rec.Fencing)
		forgotten++
	}
	if forgotten > 0 && floor > s.keyFloor() {
		s.put(bucketMeta, metaKeyTokens, putU64(uint64(floor)))
	}
	return &Result{Forgotten: forgotten}
}

// ForgettableKeys lists up to limit keys whose records could be forgotten,
// looking at no more than scan records after the key after (nil: from the
// start). next is the last record looked at, where the walk goes on; nil
// once it reached the end.
func (v *View) ForgettableKeys(after []byte, limit, scan int) (keys []KeyName, next []byte) {
	c := v.b(bucketKeys).Cursor()
	k, raw := c.First()
	if after != nil {
		if k, raw = c.Seek(after); k != nil && bytes.Equal(k, after) {
			k, raw = c.Next()
		}
	}
	var last []byte // valid while the view is
	for ; k != nil; k, raw = c.Next() {
		if scan <= 0 || len(keys) >= limit {
			return keys, bytes.Clone(last)
		}
		scan--
		last = k
		var rec KeyRecord
		if json.Unmarshal(raw, &rec) != nil || !v.forgettable(k, &rec) {
			continue
		}
		ns, key := splitKey(k)
		keys = append(keys, KeyName{Namespace: ns, Key: key})
	}
	return keys, nil
}
