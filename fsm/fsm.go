// Package fsm owns raftlockd's replicated state: a deterministic state
// machine over a bbolt file that Raft feeds with committed log entries. It
// holds leases and their FIFO wait queues, committed JSON documents, the
// transaction records of the reserved .txns namespace and (through package
// staging) uncommitted writes.
//
// Apply never reads the wall clock or a random source and never iterates a
// Go map: time and identifiers arrive inside each command, so every node that
// applies the same log ends with byte-identical buckets. A batch of entries is
// applied in ONE bbolt transaction that also records the last applied index,
// so a restart neither loses nor repeats an entry. A storage failure inside
// Apply stops the node instead of letting it diverge.
package fsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// Options configure Open.
type Options struct {
	// Observers receive the events of every committed batch.
	Observers []Observer
	// Fatal is called when storage fails inside Apply. It must not return
	// control to raft as if nothing happened; the default logs and exits.
	Fatal func(error)
	// BootID identifies the running operating system boot. Empty means
	// "read /proc/sys/kernel/random/boot_id".
	BootID string
	Logger *slog.Logger
}

// FSM is the replicated state machine. It implements raft.BatchingFSM.
type FSM struct {
	path      string
	observers []Observer
	fatal     func(error)
	logger    *slog.Logger
	bootID    string
	trusted   bool

	mu sync.RWMutex // guards db against Restore swapping it
	db *bolt.DB

	snapMu sync.Mutex
	snaps  map[*snapshot]struct{} // open snapshots: a Restore ends them

	applied     atomic.Uint64
	appliedTerm atomic.Uint64
	now         atomic.Int64 // replicated clock, Unix ms
	backend     atomic.Pointer[string]
	authGen     atomic.Uint64 // see AuthGeneration
	signalMu    sync.Mutex
	signal      chan struct{} // closed and replaced after every batch
}

var _ raft.BatchingFSM = (*FSM)(nil)

// marker is written next to the state file. bbolt runs without fsync (the
// Raft log is the durability point), so the file can be trusted after a
// restart only if it was closed cleanly or the operating system did not
// restart since it was opened (a killed process loses nothing that reached
// the page cache). Otherwise the file is discarded and Raft rebuilds it from
// the latest snapshot and the log.
type marker struct {
	Clean  bool   `json:"clean"`
	BootID string `json:"boot_id"`
}

func markerPath(path string) string { return path + ".marker" }

func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func writeMarker(path string, m marker) error {
	raw, _ := json.Marshal(m)
	tmp := markerPath(path) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, markerPath(path)); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Open opens (or creates) the state file at path. Trusted reports whether
// the existing contents may be used as they are; when it is false the file
// was discarded and the caller must let Raft restore the latest snapshot.
func Open(path string, opts Options) (*FSM, error) {
	f := &FSM{path: path, observers: opts.Observers, fatal: opts.Fatal, logger: opts.Logger,
		bootID: opts.BootID, signal: make(chan struct{})}
	if f.logger == nil {
		f.logger = slog.Default()
	}
	if f.bootID == "" {
		f.bootID = readBootID()
	}
	if f.fatal == nil {
		f.fatal = func(err error) {
			f.logger.Error("state machine storage failed; stopping to avoid divergence", "error", err)
			os.Exit(70)
		}
	}
	_, statErr := os.Stat(path)
	exists := statErr == nil
	var m marker
	if raw, err := os.ReadFile(markerPath(path)); err == nil {
		_ = json.Unmarshal(raw, &m)
	}
	f.trusted = exists && (m.Clean || (m.BootID != "" && m.BootID == f.bootID))
	if exists && !f.trusted {
		f.logger.Warn("state file was not closed cleanly before an operating system restart; rebuilding it from the snapshot and log", "path", path)
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("fsm: discard untrusted state: %w", err)
		}
	}
	if err := writeMarker(path, marker{Clean: false, BootID: f.bootID}); err != nil {
		return nil, fmt.Errorf("fsm: write marker: %w", err)
	}
	db, err := openDB(path)
	if err != nil {
		return nil, err
	}
	f.db = db
	f.loadMeta()
	return f, nil
}

func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        time.Second,
		NoSync:         true,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// A snapshot holds a read transaction while it streams; a large
		// initial mapping keeps applies from waiting on a remap meanwhile.
		InitialMmapSize: 1 << 30,
	})
	if err != nil {
		return nil, fmt.Errorf("fsm: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return staging.Init(tx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("fsm: init %s: %w", path, err)
	}
	return db, nil
}

// Trusted reports whether the state file survived from the previous run.
func (f *FSM) Trusted() bool { return f.trusted }

// loadMeta reads the applied index and term and the replicated clock.
func (f *FSM) loadMeta() {
	_ = f.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		v := meta.Get(metaApplied)
		f.appliedTerm.Store(0)
		if len(v) >= 16 {
			f.appliedTerm.Store(u64(v[8:]))
		}
		f.now.Store(int64(u64(meta.Get(metaNow))))
		b := string(meta.Get(metaBackend))
		f.backend.Store(&b)
		f.authGen.Add(1)
		f.setApplied(u64(v))
		return nil
	})
}

// Applied returns the index of the last log entry applied.
func (f *FSM) Applied() uint64 { return f.applied.Load() }

// AppliedTerm returns the Raft term of the last entry applied.
func (f *FSM) AppliedTerm() uint64 { return f.appliedTerm.Load() }

// BackendHash returns the island's backend hash, "" until it is set.
func (f *FSM) BackendHash() string {
	if b := f.backend.Load(); b != nil {
		return *b
	}
	return ""
}

// Now returns the replicated clock (Unix ms) as of the last applied entry.
func (f *FSM) Now() int64 { return f.now.Load() }

// Reset discards the state file and starts empty and untrusted, for when
// the caller finds it inconsistent with the Raft log.
func (f *FSM) Reset() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("fsm: reset: %w", err)
	}
	if err := os.Remove(f.path); err != nil {
		return fmt.Errorf("fsm: reset: %w", err)
	}
	db, err := openDB(f.path)
	if err != nil {
		return err
	}
	f.db = db
	f.trusted = false
	f.loadMeta()
	return nil
}

// WaitApplied blocks until the entry at index has been applied or ctx ends.
func (f *FSM) WaitApplied(ctx context.Context, index uint64) error {
	for {
		f.signalMu.Lock()
		ch := f.signal
		f.signalMu.Unlock()
		if f.applied.Load() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("fsm: waiting for index %d (applied %d): %w", index, f.applied.Load(), ctx.Err())
		}
	}
}

func (f *FSM) setApplied(index uint64) {
	f.applied.Store(index)
	f.signalMu.Lock()
	close(f.signal)
	f.signal = make(chan struct{})
	f.signalMu.Unlock()
}

// Apply applies a single entry; raft uses ApplyBatch, this satisfies raft.FSM.
func (f *FSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed entries in one bbolt transaction. Entries at
// or below the recorded applied index were applied before a restart and are
// skipped. Each result is a *Result (nil for skipped and non-command entries).
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	if len(logs) == 0 {
		return out
	}
	var events []Event
	var last, lastTerm uint64
	var now int64
	var backend string
	var authChanged bool
	f.mu.RLock()
	err := f.db.Update(func(tx *bolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				sf, ok := r.(storageFailure)
				if !ok {
					panic(r)
				}
				err = sf.err
			}
		}()
		s := beginApply(tx)
		applied := s.appliedIndex()
		last = applied
		for i, l := range logs {
			if l.Index <= applied {
				continue
			}
			if l.Type == raft.LogCommand {
				s.term = l.Term
				out[i] = s.apply(l.Data)
			}
			last, lastTerm = l.Index, l.Term
		}
		if last > applied {
			s.finish(last, lastTerm)
		}
		events, now, backend, authChanged = s.events, s.now, s.backend, s.authChanged
		return nil
	})
	f.mu.RUnlock()
	if err != nil {
		f.fatal(fmt.Errorf("fsm: apply entries %d..%d: %w", logs[0].Index, logs[len(logs)-1].Index, err))
		for i := range out {
			out[i] = fail(errcode.Internal.With("storage failure"))
		}
		return out
	}
	if lastTerm > 0 {
		f.appliedTerm.Store(lastTerm)
	}
	f.now.Store(now)
	if backend != "" {
		f.backend.Store(&backend)
	}
	if authChanged {
		f.authGen.Add(1)
	}
	f.setApplied(last)
	if len(events) > 0 {
		for _, o := range f.observers {
			o.Observe(events)
		}
	}
	return out
}

// View runs fn on a consistent read-only view of the state.
func (f *FSM) View(fn func(v *View) error) (err error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.db.View(func(tx *bolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				sf, ok := r.(storageFailure)
				if !ok {
					panic(r)
				}
				err = sf.err
			}
		}()
		return fn(&View{reader: reader{tx: tx}})
	})
}

// Snapshot captures the state as of the last applied entry. raft calls it on
// the apply goroutine; the returned snapshot streams a read transaction, so
// applies continue while it is persisted.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	tx, err := f.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("fsm: snapshot: %w", err)
	}
	s := &snapshot{f: f, tx: tx}
	f.snapMu.Lock()
	if f.snaps == nil {
		f.snaps = map[*snapshot]struct{}{}
	}
	f.snaps[s] = struct{}{}
	f.snapMu.Unlock()
	return s, nil
}

// snapshot is a read transaction on the state file, written out by
// Persist. Raft holds it while it asks its main loop for the configuration;
// should the main loop be installing a snapshot from the leader, the
// Restore that follows cannot close the file while the transaction is open
// and the main loop waits for the Restore. A Restore therefore ends every
// open snapshot first (one being persisted finishes); a snapshot so ended
// fails to persist, and raft takes another later.
type snapshot struct {
	f  *FSM
	mu sync.Mutex
	tx *bolt.Tx // nil once released or ended by a Restore
}

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx == nil {
		_ = sink.Cancel()
		return errors.New("fsm: persist snapshot: the state was replaced by a restore")
	}
	if _, err := s.tx.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {
	s.end()
	s.f.snapMu.Lock()
	delete(s.f.snaps, s)
	s.f.snapMu.Unlock()
}

// end rolls the transaction back, once.
func (s *snapshot) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tx != nil {
		_ = s.tx.Rollback()
		s.tx = nil
	}
}

// endSnapshots ends every open snapshot, so that the state file can close.
func (f *FSM) endSnapshots() {
	f.snapMu.Lock()
	open := make([]*snapshot, 0, len(f.snaps))
	for s := range f.snaps {
		open = append(open, s)
	}
	f.snapMu.Unlock()
	for _, s := range open {
		s.end()
	}
}

// Restore replaces the state with a snapshot stream (a bbolt file).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := f.path + ".restore"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	if _, err := io.Copy(out, rc); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("fsm: restore copy: %w", err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("fsm: restore sync: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("fsm: restore close: %w", err)
	}
	if _, err := CheckStateFile(tmp); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("fsm: restore: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endSnapshots()
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("fsm: restore close current: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("fsm: restore rename: %w", err)
	}
	if err := syncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	db, err := openDB(f.path)
	if err != nil {
		return err
	}
	f.db = db
	f.loadMeta()
	return nil
}

// Close flushes the state file and marks it cleanly closed.
func (f *FSM) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.db.Sync(); err != nil {
		return fmt.Errorf("fsm: sync: %w", err)
	}
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("fsm: close: %w", err)
	}
	return writeMarker(f.path, marker{Clean: true, BootID: f.bootID})
}

// NextDeadline is View.NextDeadline on the latest applied state.
func (f *FSM) NextDeadline(retention int64) (when int64, ok bool) {
	_ = f.View(func(v *View) error {
		when, ok = v.NextDeadline(retention)
		return nil
	})
	return when, ok
}
