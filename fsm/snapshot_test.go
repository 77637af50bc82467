package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// smallMap is the mapping the remap tests open the state file with: bbolt
// maps at least 32 KiB, so a few documents of this size make it remap.
const smallMap = 64 << 10

// openMapped is openHarness with the state file mapped with mmapSize bytes.
func openMapped(t *testing.T, mmapSize int) *harness {
	t.Helper()
	rec := &recorder{}
	f, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{Observers: []Observer{rec}, BootID: "boot-a",
		Fatal: func(err error) { t.Errorf("unexpected fatal: %v", err) }, mmapSize: mmapSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &harness{t: t, f: f, rec: rec, index: f.Applied(), now: 1_000_000}
}

// bigDocBatches returns, for n keys, one batch each that acquires the key,
// writes a document of size bytes and commits it, numbered after h's index.
func bigDocBatches(t *testing.T, h *harness, n, size int) [][]*raft.Log {
	t.Helper()
	doc := []byte(`"` + strings.Repeat("x", size) + `"`)
	var out [][]*raft.Log
	for i := range n {
		req := "big-" + strconv.Itoa(i)
		l := &LeaseInfo{Namespace: "default", Key: req, LeaseID: "lease-" + req, TxnID: "t-" + req}
		var batch []*raft.Log
		for _, c := range []*Command{
			acq(l.Key, l.TxnID, req, 10_000, 0),
			{Op: OpWrite, Write: &WriteCmd{Namespace: l.Namespace, Key: l.Key, LeaseID: l.LeaseID, TxnID: l.TxnID,
				ETag: "etag-" + req, Doc: doc}},
			release(l, false),
		} {
			c.Now = h.now
			h.index++
			batch = append(batch, logOf(t, h.index, c))
		}
		out = append(out, batch)
	}
	return out
}

// checkResults fails t when a command of the batches was refused.
func checkResults(t *testing.T, results [][]interface{}) {
	t.Helper()
	for i, out := range results {
		for j, r := range out {
			if res, _ := r.(*Result); res == nil || res.Err != nil {
				t.Fatalf("batch %d command %d: %+v", i, j, r)
			}
		}
	}
}

// mappedSize is the size of the state file bbolt uses; past the initial
// mapping bbolt has remapped the file.
func mappedSize(t *testing.T, f *FSM) int64 {
	t.Helper()
	var size int64
	if err := f.db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return size
}

// A snapshot raft holds between Snapshot and Persist (while it waits for
// its main loop) holds no read transaction: an apply that makes bbolt remap
// the growing state file goes through. Were it held, the apply would wait
// for the snapshot, the main loop for the apply, and the snapshot for the
// main loop.
func TestSnapshotNotYetPersistedDoesNotBlockARemap(t *testing.T) {
	h := openMapped(t, smallMap)
	mustLease(t, h.one(acq("k", "t1", "r1", 10_000, 0)))
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	batches := bigDocBatches(t, h, 16, 16<<10) // 256 KiB of documents
	done := make(chan [][]interface{}, 1)
	go func() {
		var results [][]interface{}
		for _, b := range batches {
			results = append(results, h.f.ApplyBatch(b))
		}
		done <- results
	}()
	var results [][]interface{}
	select {
	case results = <-done:
	case <-time.After(20 * time.Second):
		snap.Release() // lets a blocked apply finish before the test ends
		<-done
		t.Fatal("applies that remap the state file waited for a snapshot not yet persisted")
	}
	checkResults(t, results)
	if size := mappedSize(t, h.f); size <= smallMap {
		t.Fatalf("the state file (%d bytes) outgrew no mapping of %d bytes: nothing was remapped", size, smallMap)
	}

	// The snapshot still persists, and holds the entries applied since.
	dst := restoredFrom(t, persisted(t, snap))
	if dst.f.Applied() != h.f.Applied() || !bytes.Equal(dst.hash(), h.hash()) {
		t.Fatalf("restored state at %d differs from the source at %d", dst.f.Applied(), h.f.Applied())
	}
}

// journal applies commands to a harness one batch at a time and keeps the
// log, as raft would, with the state's hash after each batch.
type journal struct {
	h      *harness
	logs   []*raft.Log
	hashAt map[uint64][]byte
}

func newJournal(h *harness) *journal {
	j := &journal{h: h, hashAt: map[uint64][]byte{}}
	j.hashAt[h.f.Applied()] = h.hash()
	return j
}

// step applies the i-th batch of a varied workload: a lease taken, a
// document written and committed, a queued waiter, a refused command.
func (j *journal) step(i int) {
	h := j.h
	key := "k" + strconv.Itoa(i%7)
	req := "s" + strconv.Itoa(i)
	l := &LeaseInfo{Namespace: "default", Key: key, LeaseID: "lease-" + req, TxnID: "t-" + req}
	cmds := []*Command{
		acq(key, l.TxnID, req, 10_000, 0),
		update(l, fmt.Sprintf(`{"step":%d}`, i)),
		release(l, false),
		acq(key, "w-"+req, "w"+req, 10_000, 5_000),
		release(&LeaseInfo{Namespace: "default", Key: key, LeaseID: "lease-w" + req, TxnID: "w-" + req}, true),
	}
	var batch []*raft.Log
	for _, c := range cmds {
		c.Now = h.now
		h.index++
		batch = append(batch, logOf(h.t, h.index, c))
	}
	h.now += 10
	h.f.ApplyBatch(batch)
	j.logs = append(j.logs, batch...)
	j.hashAt[h.f.Applied()] = h.hash()
}

// replayAfter applies to dst, in batches, every entry after index, as raft
// does after installing a snapshot it labelled with index.
func (j *journal) replayAfter(dst *harness, index uint64) {
	var batch []*raft.Log
	for _, l := range j.logs {
		if l.Index <= index {
			continue
		}
		batch = append(batch, l)
		if len(batch) == 4 {
			dst.f.ApplyBatch(batch)
			batch = nil
		}
	}
	if len(batch) > 0 {
		dst.f.ApplyBatch(batch)
	}
}

// sinkFunc is a memSink that calls onWrite before each write.
type sinkFunc struct {
	memSink
	writes  int
	onWrite func(n int)
}

func (s *sinkFunc) Write(p []byte) (int, error) {
	s.writes++
	s.onWrite(s.writes)
	return s.memSink.Write(p)
}

// A persisted snapshot, installed on a fresh node, is a state the source
// went through, recording an applied index at least the one raft labels the
// snapshot with (the last applied at Snapshot), so that replaying the log
// after the label, as raft does, reaches the source's state: entries the
// state already holds are skipped, none is lost or applied twice. Entries
// applied between Snapshot and Persist are in the snapshot (Persist streams
// the state as it is when it begins); entries applied while it streams are
// not.
func TestPersistedSnapshotCoversItsIndex(t *testing.T) {
	for _, tc := range []struct {
		name            string
		between, during int // batches applied after Snapshot, before and while Persist streams
	}{
		{"nothing applied after Snapshot", 0, 0},
		{"applied between Snapshot and Persist", 3, 0},
		{"applied while Persist streams", 0, 3},
		{"applied between and while", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := openHarness(t, t.TempDir())
			j := newJournal(src)
			for i := range 5 {
				j.step(i)
			}
			snap, err := src.f.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			defer snap.Release()
			label := src.f.Applied() // what raft labels the snapshot with
			for i := range tc.between {
				j.step(100 + i)
			}
			atPersist := src.f.Applied()
			sink := &sinkFunc{onWrite: func(n int) {
				if n <= tc.during {
					j.step(200 + n)
				}
			}}
			if err := snap.Persist(sink); err != nil {
				t.Fatal(err)
			}

			dst := restoredFrom(t, sink.Bytes())
			got := dst.f.Applied()
			if got < label {
				t.Fatalf("the snapshot labelled %d records applied index %d", label, got)
			}
			if got != atPersist {
				t.Fatalf("the snapshot records applied index %d, want %d (the state when Persist began)", got, atPersist)
			}
			if want, ok := j.hashAt[got]; !ok || !bytes.Equal(dst.hash(), want) {
				t.Fatalf("the restored state is not the source's state at index %d", got)
			}
			j.replayAfter(dst, label)
			if dst.f.Applied() != src.f.Applied() || !bytes.Equal(dst.hash(), src.hash()) {
				t.Fatalf("after replaying the log from %d: applied %d, state differs=%v; source applied %d",
					label, dst.f.Applied(), !bytes.Equal(dst.hash(), src.hash()), src.f.Applied())
			}
		})
	}
}

// A Restore while a snapshot streams does not wait for the stream: the
// stream stops at its next write and the snapshot fails (raft takes another
// later) instead of being written from a file being replaced.
func TestRestoreStopsASnapshotBeingPersisted(t *testing.T) {
	src, leader, dst := leaderSnapshotAndFollower(t)
	snap, err := dst.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	writing, unblock := make(chan struct{}), make(chan struct{})
	sink := &sinkFunc{onWrite: func(n int) {
		if n == 1 {
			close(writing)
			<-unblock
		}
	}}
	persisted := make(chan error, 1)
	go func() { persisted <- snap.Persist(sink) }()
	<-writing

	gen := dst.f.gen.Load()
	restored := make(chan error, 1)
	go func() { restored <- dst.f.Restore(io.NopCloser(bytes.NewReader(leader))) }()
	for deadline := time.Now().Add(20 * time.Second); dst.f.gen.Load() == gen; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			close(unblock)
			t.Fatalf("the restore did not begin replacing the state: %v", <-restored)
		}
	}
	close(unblock)
	select {
	case err := <-persisted:
		if !errors.Is(err, errReplaced) || !sink.cancelled {
			t.Fatalf("persist while the state was replaced: %v (cancelled %v)", err, sink.cancelled)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream did not stop")
	}
	select {
	case err := <-restored:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the restore waited")
	}
	if !bytes.Equal(src.hash(), dst.hash()) {
		t.Fatal("restored state differs from the leader's")
	}
}
