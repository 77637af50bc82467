package cluster

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
)

// A restore upload is read no further than its first meta page allows:
// the data directory must have room for what that page says, and the
// upload may not run past it.
func TestSnapshotUploadIsBoundedByItsHeader(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "s.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var raw bytes.Buffer
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("meta")); return err })
	_ = db.View(func(tx *bolt.Tx) error { _, err := tx.WriteTo(&raw); return err })
	db.Close()

	var asked int64
	roomy := func(size int64) error { asked = size; return nil }
	if got, err := io.ReadAll(&sizedUpload{r: bytes.NewReader(raw.Bytes()), fits: roomy}); err != nil || !bytes.Equal(got, raw.Bytes()) {
		t.Fatalf("a whole snapshot: %d bytes, %v", len(got), err)
	}
	if asked != int64(raw.Len()) {
		t.Fatalf("room asked for %d bytes, the snapshot has %d", asked, raw.Len())
	}
	full := func(int64) error { return errcode.RequestTooLarge.With("no room") }
	if _, err := io.ReadAll(&sizedUpload{r: bytes.NewReader(raw.Bytes()), fits: full}); !errors.Is(err, errcode.RequestTooLarge) {
		t.Fatalf("no room: %v", err)
	}
	longer := append(bytes.Clone(raw.Bytes()), 0)
	if _, err := io.ReadAll(&sizedUpload{r: bytes.NewReader(longer), fits: roomy}); !errors.Is(err, errcode.InvalidSnapshot) {
		t.Fatalf("one byte more than the header says: %v", err)
	}
	if got, err := io.ReadAll(&sizedUpload{r: bytes.NewReader([]byte("short")), fits: full}); err != nil || string(got) != "short" {
		t.Fatalf("an upload too short for a header is passed on for the check to refuse: %q %v", got, err)
	}

	n := &Node{cfg: Config{DataDir: t.TempDir()}}
	if err := n.roomFor(1 << 20); err != nil {
		t.Fatalf("room for 1 MiB: %v", err)
	}
	if err := n.roomFor(1 << 60); !errors.Is(err, errcode.RequestTooLarge) {
		t.Fatalf("room for 1 EiB: %v", err)
	}
}
