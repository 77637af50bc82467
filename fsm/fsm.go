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
	"strconv"
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
	// Fatal is called when storage fails inside Apply, or when the state
	// no longer matches the Raft log (Halt). It must not return control to
	// raft as if nothing happened; the default logs and exits.
	Fatal func(error)
	// BootID identifies the running operating system boot. Empty means
	// "read /proc/sys/kernel/random/boot_id".
	BootID string
	Logger *slog.Logger

	// mmapSize replaces defaultMmapSize; tests set it small to make bbolt
	// remap the state file early.
	mmapSize int
}

// FSM is the replicated state machine. It implements raft.BatchingFSM.
type FSM struct {
	path      string
	observers []Observer
	fatal     func(error)
	logger    *slog.Logger
	bootID    string
	trusted   bool

	mu       sync.RWMutex // guards db against Restore and Reset swapping it
	db       *bolt.DB
	mmapSize int
	// gen counts the times db was closed or replaced (Restore, Reset,
	// Close); it changes only under mu's write lock. A snapshot persists
	// only the state of the generation it was taken in.
	gen atomic.Uint64

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

// restorePath is where Restore writes the snapshot it installs.
func restorePath(path string) string { return path + ".restore" }

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
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the entries of dir (files created, renamed or removed in
// it) durable.
func SyncDir(dir string) error {
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
		bootID: opts.BootID, mmapSize: opts.mmapSize, signal: make(chan struct{})}
	if f.mmapSize == 0 {
		f.mmapSize = defaultMmapSize
	}
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
	db, err := openDB(path, f.mmapSize)
	if err != nil {
		return nil, err
	}
	// A Restore cut short by a crash left its copy of the snapshot.
	if err := os.Remove(restorePath(path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		db.Close()
		return nil, fmt.Errorf("fsm: remove an unfinished restore: %w", err)
	}
	f.db = db
	f.loadMeta()
	return f, nil
}

// defaultMmapSize is the address space the state file is mapped with:
// 10 GiB on 64-bit platforms (as etcd maps its bbolt file), 1 GiB on 32-bit
// ones. bbolt must remap the file when it grows past its mapping, and a
// remap waits until every read transaction has ended; Persist holds one for
// as long as it streams a snapshot, so an apply that needed a remap would
// wait for the whole snapshot to be written. On Linux the mapping is address
// space, not memory: only the pages of the file that are read take any.
// Past this size the mapping grows by 1 GiB at a time, and an apply that
// crosses such a step while a snapshot streams waits for it.
const defaultMmapSize = (1 << 30) * (1 + 9*(strconv.IntSize/64))

func openDB(path string, mmapSize int) (*bolt.DB, error) {
	if err := CheckFileLength(path); err != nil {
		return nil, fmt.Errorf("fsm: state file %w; move it (and %s) out of the data directory "+
			"to have it rebuilt from the snapshots and Raft log on start", err, filepath.Base(markerPath(path)))
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         time.Second,
		NoSync:          true,
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: mmapSize,
	})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("fsm: open %s: another process holds it (is another raftlockd running on this data directory?): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("fsm: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		counted := tx.Bucket(bucketQCounts) != nil
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if err := staging.Init(tx); err != nil {
			return err
		}
		return countQueuesAnew(tx, counted)
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
	f.gen.Add(1)
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("fsm: reset: %w", err)
	}
	if err := os.Remove(f.path); err != nil {
		return fmt.Errorf("fsm: reset: %w", err)
	}
	db, err := openDB(f.path, f.mmapSize)
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
		defer recoverStorage(&err)
		s := beginApply(tx)
		applied := s.appliedIndex()
		last = applied
		for i, l := range logs {
			if l.Index <= applied {
				continue
			}
			if l.Type == raft.LogCommand {
				s.term = l.Term
				out[i] = s.applyEntry(l.Data)
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

// Halt stops the node for err, a state the Raft log no longer backs, as a
// storage failure inside Apply does (Options.Fatal).
func (f *FSM) Halt(err error) { f.fatal(err) }

// View runs fn on a consistent read-only view of the state.
func (f *FSM) View(fn func(v *View) error) (err error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.db.View(func(tx *bolt.Tx) (err error) {
		defer recoverStorage(&err)
		return fn(&View{reader: reader{tx: tx}})
	})
}

// Snapshot records the index of the last applied entry and the state
// file's generation; it reads nothing. raft calls it on the apply
// goroutine, then asks its main loop for the configuration and only then
// calls Persist on its snapshot goroutine. A read transaction held in
// between would deadlock: an apply that makes bbolt remap the growing file
// waits for every read transaction to end, raft's main loop waits to hand
// the apply goroutine more entries, and the snapshot goroutine waits for the
// main loop. So Persist opens the read transaction itself.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &snapshot{f: f, gen: f.gen.Load(), index: f.applied.Load()}, nil
}

// snapshot is written out by Persist, which streams the state file as it is
// when Persist begins, under one read transaction closed before Persist
// returns.
//
// That state may be newer than the index raft labels the snapshot with (the
// last entry raft had handed the state machine when it called Snapshot):
// entries applied in between are in it. This is safe because the state file
// records the index of the last entry applied in the same transaction as the
// entries' effects, Restore takes the applied index from the file, and
// ApplyBatch skips every entry at or below it. A node that installs the
// snapshot and has raft replay the log after the label therefore skips the
// entries already in the state and applies the rest, once each; the state
// it reaches is the one it would reach from a snapshot taken at the label.
// What must never happen is the opposite, a state older than the label:
// raft would replay only the entries after the label and the ones in
// between would be lost. Persist therefore refuses a state whose applied
// index is below the one recorded by Snapshot, and any state of another
// generation: a Restore (raft installing the leader's snapshot, or an
// operator's backup, which may be older) or a Reset that replaced the file
// after Snapshot fails the snapshot, and raft takes another later. A
// Restore that begins while Persist streams makes the stream fail at its
// next write, and waits, as it closes the old file, only for that write.
// (raft's label may exceed the recorded index by entries raft never hands
// the state machine, its no-ops and barriers, and after an operator's
// restore by the entries the restored file replaced: none is to be applied.)
type snapshot struct {
	f     *FSM
	gen   uint64 // generation of the state file at Snapshot
	index uint64 // applied index at Snapshot

	mu       sync.Mutex // held by Persist; Release waits for it
	released bool
}

// errReplaced fails a snapshot whose state file was replaced (Restore,
// Reset) or closed after Snapshot.
var errReplaced = errors.New("the state file was replaced or closed")

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := errors.New("the snapshot was released")
	if !s.released {
		err = s.writeTo(sink)
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("fsm: persist snapshot of index %d: %w", s.index, err)
	}
	return sink.Close()
}

// writeTo streams the current state, of the snapshot's generation, to w.
func (s *snapshot) writeTo(w io.Writer) error {
	f := s.f
	f.mu.RLock()
	if f.gen.Load() != s.gen {
		f.mu.RUnlock()
		return errReplaced
	}
	tx, err := f.db.Begin(false)
	f.mu.RUnlock()
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if applied := u64(tx.Bucket(bucketMeta).Get(metaApplied)); applied < s.index {
		return fmt.Errorf("the state (applied index %d) is older than the snapshot", applied)
	}
	_, err = tx.WriteTo(&genWriter{w: w, s: s})
	if f.gen.Load() != s.gen {
		// Replaced as the stream ended: raft no longer has this state.
		return errReplaced
	}
	return err
}

// genWriter fails once the state file of the snapshot's generation is being
// closed, so that the read transaction streaming it ends.
type genWriter struct {
	w io.Writer
	s *snapshot
}

func (g *genWriter) Write(p []byte) (int, error) {
	if g.s.f.gen.Load() != g.s.gen {
		return 0, errReplaced
	}
	return g.w.Write(p)
}

// Release waits for a Persist under way; the snapshot no longer persists.
func (s *snapshot) Release() {
	s.mu.Lock()
	s.released = true
	s.mu.Unlock()
}

// Restore replaces the state with a snapshot stream (a bbolt file).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := restorePath(f.path)
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
	// A snapshot taken of the current state no longer persists; one
	// streaming it stops at its next write, and Close waits for that.
	f.gen.Add(1)
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("fsm: restore close current: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("fsm: restore rename: %w", err)
	}
	if err := SyncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("fsm: restore: %w", err)
	}
	db, err := openDB(f.path, f.mmapSize)
	if err != nil {
		return err
	}
	f.db = db
	f.loadMeta()
	for _, o := range f.observers {
		o.Observe([]Event{{Kind: EventRestored}})
	}
	return nil
}

// Close flushes the state file and marks it cleanly closed.
func (f *FSM) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.Add(1)
	if err := f.db.Sync(); err != nil {
		return fmt.Errorf("fsm: sync: %w", err)
	}
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("fsm: close: %w", err)
	}
	return writeMarker(f.path, marker{Clean: true, BootID: f.bootID})
}

// Rules is the newest entry format whose rules the island follows (raised
// by a sweep once every server applies it, SweepCmd.Format).
func (f *FSM) Rules() (format int) {
	_ = f.View(func(v *View) error {
		format = v.rules()
		return nil
	})
	return format
}

// NextDeadline is View.NextDeadline on the latest applied state.
func (f *FSM) NextDeadline(retention int64) (when int64, ok bool) {
	_ = f.View(func(v *View) error {
		when, ok = v.NextDeadline(retention)
		return nil
	})
	return when, ok
}
