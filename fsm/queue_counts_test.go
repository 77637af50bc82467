package fsm

import (
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
)

// checkCounts fails the test unless every queue's stats, as read from the
// counters, equal those of a walk, and the counters hold exactly what a
// count of the whole state gives.
func (h *harness) checkCounts(t *testing.T, step string, queues ...string) {
	t.Helper()
	err := h.f.View(func(v *View) error {
		for _, q := range queues {
			got, want := v.QueueStats("default", q), v.queueStatsWalk("default", q)
			if got.Head != nil && want.Head != nil && got.Head.ID == want.Head.ID {
				got.Head, want.Head = nil, nil
			}
			if got != want {
				return fmt.Errorf("%s: stats of %s from the counters %+v, from a walk %+v", step, q, got, want)
			}
		}
		if err := countsEqualAWalk(v); err != nil {
			return fmt.Errorf("%s: %w", step, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The queue counters stay equal to a walk over the queues through a random
// mix of enqueues (delayed, with a time to live, staged in transactions),
// dequeues (waiting, stateful, enlisted), acks, nacks, extends, cancels,
// decisions, expiries, dead letters, dropped waits, snapshot restores and
// reopens of the state file.
func TestQueueCountersEqualAWalk(t *testing.T) {
	rng := rand.New(rand.NewSource(testSeed(t)))
	h := openHarness(t, t.TempDir())
	queues := []string{"q", "q" + DeadLetterSuffix, "r", "r" + DeadLetterSuffix}
	var held []*MessageInfo // deliveries, some of them over by now
	var txns []string
	seen := 0 // events of h.rec already looked at
	n := 0
	for step := range 600 {
		n++
		q := queues[2*rng.Intn(2)]
		id := fmt.Sprintf("m%d", rng.Intn(40)) // ids come back: dead letters replace their kind
		var cmd *Command
		switch r := rng.Intn(100); {
		case r < 30:
			cmd = enq(q, id, "body")
			cmd.Enqueue.MaxAttempts = 1 + rng.Intn(2)
			if rng.Intn(4) == 0 {
				cmd.Enqueue.Delay = int64(rng.Intn(3_000))
			}
			if rng.Intn(4) == 0 {
				cmd.Enqueue.TTL = int64(1 + rng.Intn(5_000))
			}
			if rng.Intn(5) == 0 {
				cmd.Enqueue.TxnID = fmt.Sprintf("tx%d", rng.Intn(6))
				txns = append(txns, cmd.Enqueue.TxnID)
			}
		case r < 50:
			cmd = deq(q, fmt.Sprintf("d%d", n), int64(rng.Intn(2)*rng.Intn(4_000)))
			cmd.Dequeue.Visibility = int64(500 + rng.Intn(3_000))
			switch rng.Intn(5) {
			case 0:
				cmd.Dequeue.TxnID = fmt.Sprintf("tx%d", rng.Intn(6))
				txns = append(txns, cmd.Dequeue.TxnID)
			case 1:
				cmd.Dequeue.WithState, cmd.Dequeue.StateLease, cmd.Dequeue.StateTxn = true, fmt.Sprintf("sl%d", n), fmt.Sprintf("st%d", n)
			}
		case r < 75 && len(held) > 0:
			m := held[rng.Intn(len(held))]
			switch rng.Intn(3) {
			case 0:
				cmd = &Command{Op: OpQAck, QAck: &QueueAckCmd{MessageRef: ref(m)}}
			case 1:
				cmd = &Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: rng.Intn(3) == 0,
					Delay: int64(rng.Intn(2) * rng.Intn(2_000))}}
			default:
				cmd = &Command{Op: OpQExtend, QExtend: &QueueExtendCmd{MessageRef: ref(m), By: int64(rng.Intn(3_000))}}
			}
		case r < 80:
			cmd = &Command{Op: OpQCancel, QCancel: &QueueCancelCmd{Namespace: "default", Queue: q,
				RequestID: fmt.Sprintf("d%d", n-rng.Intn(20))}}
		case r < 85 && len(txns) > 0:
			state := TxnCommit
			if rng.Intn(2) == 0 {
				state = TxnRollback
			}
			cmd = &Command{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: txns[rng.Intn(len(txns))], State: state}}
		case r < 88:
			cmd = &Command{Op: OpDropWaits, DropWaits: &DropWaitsCmd{Node: "n2", Run: fmt.Sprintf("run%d", n)}}
		case r < 93:
			h.now += int64(rng.Intn(3_000))
			cmd = sweep()
		case r < 96:
			h = snapshotRestored(t, h)
			h.checkCounts(t, fmt.Sprintf("step %d, restored from a snapshot", step), queues...)
			seen = 0
			continue
		default:
			h = reopened(t, h)
			h.checkCounts(t, fmt.Sprintf("step %d, reopened", step), queues...)
			seen = 0
			continue
		}
		if cmd == nil {
			continue
		}
		res := h.one(cmd)
		if res.Queue != nil && res.Queue.Message != nil && res.Queue.Message.Lease != nil {
			held = append(held, res.Queue.Message)
		}
		for _, ev := range h.rec.events[seen:] {
			if ev.Kind == EventDelivered && ev.Message != nil && ev.Message.Lease != nil {
				held = append(held, ev.Message)
			}
		}
		seen = len(h.rec.events)
		h.checkCounts(t, fmt.Sprintf("step %d (%s)", step, cmd.Op), queues...)
	}

}

// snapshotRestored is a new state machine restored from a snapshot of h's.
func snapshotRestored(t *testing.T, h *harness) *harness {
	t.Helper()
	dst := restoredFrom(t, snapshotBytes(t, h))
	dst.now, dst.index = h.now, dst.f.Applied()
	return dst
}

// reopened closes h's state machine and opens its state file again.
func reopened(t *testing.T, h *harness) *harness {
	t.Helper()
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	o := openHarness(t, filepath.Dir(h.f.path))
	o.now = h.now
	return o
}

// A state file whose counters are missing (written by a build without
// them) or behind its applied index (a build without them applied entries
// to it since) gets them counted anew when it is opened.
func TestQueueCountersAreCountedAnewWhenOutOfDate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(tx *bolt.Tx) error
	}{
		{"missing", func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketQCounts) }},
		{"behind", func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketQCounts)
			c := queueCounts{Msgs: 100, Ready: 7}
			if err := b.Put(queueID("default", "q"), c.encode()); err != nil {
				return err
			}
			meta := tx.Bucket(bucketMeta)
			return meta.Put(metaQCountsAt, putU64(u64(meta.Get(metaApplied))-1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := openHarness(t, queueStateSpoiled(t, tc.spoil))
			h.checkCounts(t, "reopened", "q", "r")
			if st := h.stats("q"); st.Ready != 2 || st.InFlight != 1 || st.Head == nil || st.Head.ID != "b" {
				t.Fatalf("stats of q after the counters were counted anew: %+v", st)
			}
			if st := h.stats("r"); st.InFlight != 1 || st.Waiting != 1 {
				t.Fatalf("stats of r after the counters were counted anew: %+v", st)
			}
		})
	}
}

// countsEqualAWalk reports whether the queue counters are up to date and
// hold exactly what a count of the whole state gives.
func countsEqualAWalk(v *View) error {
	counts, err := walkQueueCounts(v.tx)
	if err != nil {
		return err
	}
	if !countsCurrent(v.tx) {
		return errors.New("the queue counters are not up to date")
	}
	stored := map[string]queueCounts{}
	_ = v.b(bucketQCounts).ForEach(func(k, val []byte) error {
		stored[string(k)] = decodeQueueCounts(val)
		return nil
	})
	if len(stored) != len(counts) {
		return fmt.Errorf("%d queues counted, a walk finds %d", len(stored), len(counts))
	}
	for qid, c := range counts {
		if stored[qid] != *c {
			return fmt.Errorf("counters of %q %+v, a walk gives %+v", qid, stored[qid], *c)
		}
	}
	return nil
}

// queueStateSpoiled writes a closed state file holding queues q and r (a
// delivery in flight in each, two ready messages in q, a waiting dequeue on
// r), changes it with spoil, and returns its directory.
func queueStateSpoiled(t *testing.T, spoil func(tx *bolt.Tx) error) string {
	t.Helper()
	dir := t.TempDir()
	h := openHarness(t, dir)
	h.run(enq("q", "a", "1"), enq("q", "b", "2"), enq("q", "c", "3"), enq("r", "d", "4"))
	mustDeliver(t, h.one(deq("q", "r1", 0)))
	h.one(deq("r", "r2", 0))
	h.one(deq("r", "r3", 5_000))
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(spoil); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A backup whose counters claim to be up to date and do not match its
// queues is refused; one whose counters are behind is counted anew.
func TestABackupWithWrongQueueCountersIsRefused(t *testing.T) {
	wrong := func(tx *bolt.Tx) error {
		c := queueCounts{Msgs: 3, Ready: 3}
		return tx.Bucket(bucketQCounts).Put(queueID("default", "q"), c.encode())
	}
	if _, err := CheckBackupFile(filepath.Join(queueStateSpoiled(t, wrong), "state.db")); !errors.Is(err, errcode.InvalidSnapshot) {
		t.Fatalf("a backup with wrong counters: %v", err)
	}
	behind := func(tx *bolt.Tx) error {
		if err := wrong(tx); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Delete(metaQCountsAt)
	}
	if _, err := CheckBackupFile(filepath.Join(queueStateSpoiled(t, behind), "state.db")); err != nil {
		t.Fatalf("a backup whose counters are behind: %v", err)
	}
}
