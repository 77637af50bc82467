package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
)

// Queue counters. q_counts keeps, for every queue that has any, how many
// messages, ready messages, deliveries in flight, staged messages and
// waiting dequeues it holds, so that a queue's stats cost a few lookups
// instead of a walk over its messages. The counters are derived: apply
// keeps them in step with q_msgs, q_ready and q_waiters in the same write
// transaction (applyState.put and del), and no command reads them, so they
// change nothing a log entry computes. They are written in a canonical form
// (a queue with nothing to count has no record), and so are the same bytes
// on every node that applied the same log, however it got there.
//
// metaQCountsAt holds the applied index they were last brought up to date
// with. A state file whose counters are missing or do not match its applied
// index (one written before the counters existed, a snapshot of such a
// state, a state an older build applied entries to after a newer one had
// counted) gets them counted anew when it is opened or restored; a snapshot
// or backup whose counters claim to be up to date and are not is refused
// (checkCounts).
var (
	bucketQCounts = []byte("q_counts")    // qid -> queueCounts
	metaQCountsAt = []byte("q_counts_at") // the applied index (8 bytes) q_counts are up to date with
)

// queueCounts are the counters of one queue.
type queueCounts struct {
	Msgs, Ready, Leased, Staged, Waiting int64
}

const queueCountsLen = 5 * 8

func (c *queueCounts) fields() []*int64 {
	return []*int64{&c.Msgs, &c.Ready, &c.Leased, &c.Staged, &c.Waiting}
}

func (c *queueCounts) encode() []byte {
	out := make([]byte, 0, queueCountsLen)
	for _, f := range c.fields() {
		out = binary.BigEndian.AppendUint64(out, uint64(*f))
	}
	return out
}

func decodeQueueCounts(raw []byte) queueCounts {
	var c queueCounts
	if len(raw) != queueCountsLen {
		return c
	}
	for i, f := range c.fields() {
		*f = int64(binary.BigEndian.Uint64(raw[8*i:]))
	}
	return c
}

func (c *queueCounts) zero() bool { return *c == queueCounts{} }

// messageClass is what of a message record the counters depend on.
type messageClass struct {
	Lease    *struct{} `json:"lease"`
	StagedBy string    `json:"staged_by"`
}

// classify reports whether the message record raw is staged and whether
// it is leased (not staged); a nil record is neither.
func classify(raw []byte) (staged, leased bool) {
	if raw == nil {
		return false, false
	}
	var m messageClass
	if err := json.Unmarshal(raw, &m); err != nil {
		must(fmt.Errorf("fsm: decode %s record: %w", bucketQMsgs, err))
	}
	return m.StagedBy != "", m.StagedBy == "" && m.Lease != nil
}

// msgQueueID is the qid of message key k (qid\0id).
func msgQueueID(k []byte) []byte {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return nil
	}
	j := bytes.IndexByte(k[i+1:], 0)
	if j < 0 {
		return nil
	}
	return k[:i+1+j]
}

// seqQueueID is the qid of a q_ready or q_waiters key (qid\0seq(8)).
func seqQueueID(k []byte) []byte {
	if len(k) < 9 {
		return nil
	}
	return k[:len(k)-9]
}

// countDelta changes the counters (c) as a write of val (nil: a delete)
// over old (nil: nothing) under key k of bucket name changes them.
func countDelta(name, k, old, val []byte, c func(qid []byte) *queueCounts) {
	switch {
	case bytes.Equal(name, bucketQMsgs):
		qid := msgQueueID(k)
		if qid == nil {
			return
		}
		wasStaged, wasLeased := classify(old)
		staged, leased := classify(val)
		q := c(qid)
		q.Msgs += b2i(val != nil) - b2i(old != nil)
		q.Staged += b2i(staged) - b2i(wasStaged)
		q.Leased += b2i(leased) - b2i(wasLeased)
	case bytes.Equal(name, bucketQReady), bytes.Equal(name, bucketQWaiters):
		qid := seqQueueID(k)
		if qid == nil || (old == nil) == (val == nil) {
			return
		}
		q := c(qid)
		f := &q.Ready
		if bytes.Equal(name, bucketQWaiters) {
			f = &q.Waiting
		}
		*f += b2i(val != nil) - b2i(old != nil)
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// countQueues keeps the counters of the batch in step with a write of val
// (nil: a delete) under key k of bucket name.
func (s *applyState) countQueues(name, k, val []byte) {
	if !bytes.Equal(name, bucketQMsgs) && !bytes.Equal(name, bucketQReady) && !bytes.Equal(name, bucketQWaiters) {
		return
	}
	countDelta(name, k, s.b(name).Get(k), val, s.queueCounts)
}

// queueCounts returns the batch's counters of queue qid, read from the
// state the first time the batch needs them.
func (s *applyState) queueCounts(qid []byte) *queueCounts {
	if s.qcounts == nil {
		s.qcounts = map[string]*queueCounts{}
	}
	c, ok := s.qcounts[string(qid)]
	if !ok {
		v := decodeQueueCounts(s.b(bucketQCounts).Get(qid))
		c = &v
		s.qcounts[string(qid)] = c
	}
	return c
}

// flushQueueCounts writes the batch's counters and the index they are up
// to date with.
func (s *applyState) flushQueueCounts(index uint64) {
	b := s.b(bucketQCounts)
	qids := make([]string, 0, len(s.qcounts))
	for qid := range s.qcounts {
		qids = append(qids, qid)
	}
	slices.Sort(qids)
	for _, qid := range qids {
		if c := s.qcounts[qid]; c.zero() {
			must(b.Delete([]byte(qid)))
		} else {
			must(b.Put([]byte(qid), c.encode()))
		}
	}
	must(s.b(bucketMeta).Put(metaQCountsAt, putU64(index)))
}

// countQueuesAnew rebuilds q_counts from the messages, ready entries and
// waiting dequeues, unless the state had counters (counted) up to date
// with its applied index.
func countQueuesAnew(tx *bolt.Tx, counted bool) error {
	if counted && countsCurrent(tx) {
		return nil
	}
	applied := tx.Bucket(bucketMeta).Get(metaApplied)
	counts, err := walkQueueCounts(tx)
	if err != nil {
		return err
	}
	if err := tx.DeleteBucket(bucketQCounts); err != nil {
		return err
	}
	b, err := tx.CreateBucket(bucketQCounts)
	if err != nil {
		return err
	}
	for qid, c := range counts {
		if err := b.Put([]byte(qid), c.encode()); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketMeta).Put(metaQCountsAt, putU64(u64(applied)))
}

// countsCurrent reports whether the counters of tx are up to date with its
// applied index.
func countsCurrent(tx *bolt.Tx) bool {
	meta := tx.Bucket(bucketMeta)
	at := meta.Get(metaQCountsAt)
	return tx.Bucket(bucketQCounts) != nil && at != nil && u64(at) == u64(meta.Get(metaApplied))
}

// walkQueueCounts counts every queue's messages, ready entries and waiting
// dequeues by walking them.
func walkQueueCounts(tx *bolt.Tx) (counts map[string]*queueCounts, err error) {
	counts = map[string]*queueCounts{}
	get := func(qid []byte) *queueCounts {
		c, ok := counts[string(qid)]
		if !ok {
			c = &queueCounts{}
			counts[string(qid)] = c
		}
		return c
	}
	defer recoverStorage(&err)
	for _, name := range [][]byte{bucketQMsgs, bucketQReady, bucketQWaiters} {
		b := tx.Bucket(name)
		if b == nil {
			continue
		}
		err := b.ForEach(func(k, v []byte) error {
			countDelta(name, k, nil, v, get) // as if written into an empty bucket
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	for qid, c := range counts {
		if c.zero() {
			delete(counts, qid)
		}
	}
	return counts, nil
}

// checkCounts refuses a state file whose counters claim to be up to date
// with its applied index but differ from a count of its queues.
func checkCounts(tx *bolt.Tx) error {
	if !countsCurrent(tx) {
		return nil // counted anew when opened
	}
	counts, err := walkQueueCounts(tx)
	if err != nil {
		return err
	}
	n := 0
	err = tx.Bucket(bucketQCounts).ForEach(func(k, v []byte) error {
		n++
		if c, ok := counts[string(k)]; !ok || len(v) != queueCountsLen || decodeQueueCounts(v) != *c {
			return errcode.InvalidSnapshot.With("the counters of queue %q do not match its messages", k)
		}
		return nil
	})
	if err == nil && n != len(counts) {
		err = errcode.InvalidSnapshot.With("%d queues have counters, %d have messages or waiting dequeues", n, len(counts))
	}
	return err
}
