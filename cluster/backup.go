package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// Backups: an operator saves a snapshot of the replicated state (the bbolt
// state file) from any node and restores it into the whole cluster through
// the leader.

// SnapshotInfo describes a saved snapshot.
type SnapshotInfo struct {
	// Index is raft's index for the snapshot: it covers every entry up to
	// it, and may hold later ones (the state file records its own applied
	// index, which a restore uses).
	Index  uint64
	Term   uint64
	Size   int64  // bytes in the stream
	SHA256 string // hex SHA-256 of the stream, for the copy's integrity
}

// SaveSnapshot takes a snapshot of this node's state that covers every
// write acknowledged before the call, and opens it for reading. The stream
// is a raftlockd state file; the caller closes it.
func (n *Node) SaveSnapshot(ctx context.Context) (SnapshotInfo, io.ReadCloser, error) {
	if err := n.Read(ctx, func(*fsm.View) error { return nil }); err != nil {
		return SnapshotInfo{}, nil, err
	}
	for attempt := 0; ; attempt++ {
		f := n.raft.Snapshot()
		err := f.Error()
		if errors.Is(err, raft.ErrNothingNewToSnapshot) && attempt == 0 {
			// raft has handed this node's state machine no entry since it
			// started (a restart with nothing after its last snapshot):
			// give raft an entry, and wait until it is applied here too. A
			// follower hears of the entry's commit only after the leader
			// answered the proposal, and raft's state machine goroutine,
			// which also takes the snapshot, counts the entry once it is
			// applied.
			if _, err := n.Propose(ctx, &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}}); err != nil {
				return SnapshotInfo{}, nil, err
			}
			if err := n.Read(ctx, func(*fsm.View) error { return nil }); err != nil {
				return SnapshotInfo{}, nil, err
			}
			continue
		}
		if err != nil {
			return SnapshotInfo{}, nil, n.adminErr("snapshot", err)
		}
		meta, rc, err := f.Open()
		if err != nil {
			return SnapshotInfo{}, nil, n.adminErr("open snapshot", err)
		}
		sum, err := n.snapshotSHA256(meta.ID)
		if err != nil {
			rc.Close()
			return SnapshotInfo{}, nil, n.adminErr("checksum snapshot", err)
		}
		return SnapshotInfo{Index: meta.Index, Term: meta.Term, Size: meta.Size, SHA256: sum}, rc, nil
	}
}

// snapshotSHA256 reads the stored snapshot id once more and returns its
// hex SHA-256, so that the stream can be sent with its checksum ahead.
// The caller holds the snapshot open, so a newer snapshot that removes it
// from the store meanwhile leaves that reader intact; this reader is opened
// right after it.
func (n *Node) snapshotSHA256(id string) (string, error) {
	_, rc, err := n.snaps.Open(id)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// adminErr classifies a raft failure of an operator request: raft's own
// errors as usual, anything else (a configuration change in flight, a
// snapshot already running) as unavailable for now.
func (n *Node) adminErr(what string, err error) error {
	var e *errcode.Error
	if errors.As(n.raftErr(err), &e) {
		return e
	}
	ue := errcode.Unavailable.With("%s: %v", what, err)
	ue.RetryAfter = 1
	return ue
}

// RestoreInfo describes a completed restore.
type RestoreInfo struct {
	Bytes int64  // size of the restored state file
	Index uint64 // applied index recorded in it
}

// uploadPattern names the files a restore stores its upload in, in the
// data directory; Open removes those a crash left behind.
const uploadPattern = "restore-*.upload"

// Restore replaces the state of the whole cluster with a snapshot stream as
// SaveSnapshot produces it. Only the leader restores: on any other node it
// answers not_leader (naming the leader) before reading anything from r.
// The stream is stored in the data directory and checked: a file that is
// not a raftlockd state file is invalid_snapshot and changes nothing.
//
// Proposals wait while the state is replaced. Fencing counters and the
// replicated clock never move back: the restored file is raised to the
// current values first (fsm.PrepareRestore). Raft then installs it on the
// leader and, as a snapshot, on every follower.
func (n *Node) Restore(ctx context.Context, r io.Reader) (RestoreInfo, error) {
	if !n.IsLeader() {
		if _, _, err := n.awaitLeader(ctx); err != nil {
			return RestoreInfo{}, err
		}
		if !n.IsLeader() {
			return RestoreInfo{}, n.notLeader()
		}
	}
	tmp, err := os.CreateTemp(n.cfg.DataDir, uploadPattern)
	if err != nil {
		return RestoreInfo{}, fmt.Errorf("cluster: restore: %w", err)
	}
	defer os.Remove(tmp.Name())
	src := &readErr{r: &sizedUpload{r: r, fits: n.roomFor}}
	size, err := io.Copy(tmp, src)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	switch {
	case src.err != nil && ctx.Err() != nil:
		return RestoreInfo{}, fmt.Errorf("cluster: restore: %w", ctx.Err())
	case errors.As(src.err, new(*errcode.Error)):
		return RestoreInfo{}, src.err // the reader's own verdict on the upload (a checksum)
	case src.err != nil:
		return RestoreInfo{}, errcode.InvalidBody.With("reading the snapshot: %v", src.err)
	case err != nil:
		return RestoreInfo{}, fmt.Errorf("cluster: restore: store the snapshot: %w", err)
	case size == 0:
		return RestoreInfo{}, errcode.MissingBody.With("the snapshot is empty")
	}
	applied, err := fsm.CheckBackupFile(tmp.Name())
	if err != nil {
		return RestoreInfo{}, err
	}
	if err := n.restoreFile(ctx, tmp.Name(), applied); err != nil {
		return RestoreInfo{}, err
	}
	n.cfg.Logger.Warn("restored the cluster's state from a snapshot", "bytes", size, "snapshot_applied_index", applied)
	// Move the applied index past the restore point, so that reads and a
	// restart find the state machine where raft is.
	if _, err := n.Propose(ctx, &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}}); err != nil {
		n.cfg.Logger.Warn("no-op after restore", "error", err)
	}
	return RestoreInfo{Bytes: size, Index: applied}, nil
}

// restoreFile hands the checked state file at path to raft, with proposals
// held back from the moment the current state is read until raft has
// replaced it.
func (n *Node) restoreFile(ctx context.Context, path string, applied uint64) error {
	n.restoreMu.Lock()
	defer n.restoreMu.Unlock()
	timeout := time.Minute
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	// Every entry enqueued before the gate closed is applied.
	if err := n.raft.Barrier(timeout).Error(); err != nil {
		return n.adminErr("restore", err)
	}
	if err := n.fsm.PrepareRestore(path); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cluster: restore: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cluster: restore: %w", err)
	}
	// raft records the snapshot after max(Index, its last index): the
	// entries that follow must come after the file's applied index.
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: applied, Size: st.Size()}
	last, term := n.raft.LastIndex(), n.raft.CurrentTerm()
	if err := n.raft.Restore(meta, f, timeout); err != nil {
		if n.restoreStored(last, term) {
			// raft installed the file here, then failed to replicate it
			// (leadership lost, shutdown): the next leader may or may
			// not have it. Not an answer that nothing happened, which
			// has the upload sent to the next leader.
			return errcode.Unavailable.With("restore: the snapshot was installed on this server, which lost "+
				"the leadership before it was replicated; the restore may or may not hold: %v", err)
		}
		return n.adminErr("restore", err)
	}
	return nil
}

// restoreStored tells whether raft stored a restored snapshot after index
// last, in term: it installs the file as such a snapshot before it
// replicates it, and restarts from it.
func (n *Node) restoreStored(last, term uint64) bool {
	snaps, err := n.snaps.List()
	if err != nil {
		return true // unknown
	}
	return len(snaps) > 0 && snaps[0].Index > last && snaps[0].Term == term
}

// sizedUpload reads a snapshot upload no further than the size its first
// meta page gives (fsm.SnapshotSize), and no further than that page when
// the upload does not start with one, or when the data directory has no
// room for it: an upload cannot fill the disk the Raft log lives on.
type sizedUpload struct {
	r    io.Reader
	fits func(size int64) error
	size int64 // from the header; 0 until it is read, -1 for an upload too short to have one
	read int64
}

func (u *sizedUpload) Read(p []byte) (int, error) {
	if u.size == 0 {
		head := make([]byte, fsm.SnapshotHeaderBytes)
		n, err := io.ReadFull(u.r, head)
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			u.size, u.r = -1, bytes.NewReader(head[:n]) // the check refuses it whole
		case err != nil:
			return 0, err
		default:
			if u.size, err = fsm.SnapshotSize(head); err != nil {
				return 0, err
			}
			if err := u.fits(u.size); err != nil {
				return 0, err
			}
			u.r = io.MultiReader(bytes.NewReader(head), u.r)
		}
	}
	n, err := u.r.Read(p)
	if u.read += int64(n); u.size > 0 && u.read > u.size {
		return n, errcode.InvalidSnapshot.With("the upload runs past the %d bytes its first page gives", u.size)
	}
	return n, err
}

// roomFor tells whether the data directory has room for a restore of a
// state file of size bytes: the upload, raft's snapshot of it and the new
// state file, with 64 MiB to spare.
func (n *Node) roomFor(size int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.cfg.DataDir, &st); err != nil {
		return nil // unknown: writing will tell
	}
	free := uint64(st.Bavail) * uint64(st.Bsize)
	if need := 3*uint64(size) + 64<<20; need > free {
		return errcode.RequestTooLarge.With("a snapshot of %d bytes needs %d bytes free in the data directory, which has %d",
			size, need, free)
	}
	return nil
}

// readErr remembers a failure of the reader, to tell a bad upload from a
// local storage failure.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}
