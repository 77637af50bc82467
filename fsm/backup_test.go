package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/staging"
)

// snapshotFile persists a snapshot of h's state to a file.
func snapshotFile(t *testing.T, h *harness) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(path, snapshotBytes(t, h), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A damaged or foreign file is invalid_snapshot, never a crash; an intact
// one passes.
func TestCheckStateFileRejectsDamagedFiles(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for i := range 300 {
		l := mustLease(t, h.one(acq("key-"+strconv.Itoa(i), "t"+strconv.Itoa(i), "r"+strconv.Itoa(i), 60_000, 0)))
		h.one(update(l, `{"n":`+strconv.Itoa(i)+`,"pad":"`+string(make([]byte, 64))+`"}`))
		h.one(release(l, false))
	}
	good := snapshotFile(t, h)
	applied, err := CheckStateFile(good)
	if err != nil || applied != h.f.Applied() {
		t.Fatalf("intact snapshot: applied %d, %v; want %d", applied, err, h.f.Applied())
	}
	raw, _ := os.ReadFile(good)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wantInvalid := func(what, path string) {
		t.Helper()
		_, err := CheckStateFile(path)
		if !errors.Is(err, errcode.InvalidSnapshot) {
			t.Fatalf("%s: %v, want invalid_snapshot", what, err)
		}
		if strings.Contains(err.Error(), "runtime error") {
			t.Errorf("%s: %v, want the reason in the operator's terms", what, err)
		}
	}
	wantInvalid("garbage", write("garbage", []byte("not a state file at all")))
	wantInvalid("half", write("half", raw[:len(raw)/2]))
	wantInvalid("no pages", write("meta-only", raw[:2*4096]))

	// A bbolt file of another application.
	other := filepath.Join(dir, "other.db")
	db, err := bolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("things")); return err })
	db.Close()
	wantInvalid("foreign bbolt file", other)

}

// A file whose pages read back but whose documents, staged documents or
// message payloads do not match the records describing them is refused:
// it would serve damaged state as intact.
func TestCheckStateFileRejectsContentsThatDoNotMatchTheirRecords(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("doc", "t1", "r1", 60_000, 0)))
	h.one(update(l, `{"step":1}`))
	h.one(release(l, false))
	staged := mustLease(t, h.one(acq("staged", "t2", "r2", 60_000, 0)))
	h.one(update(staged, `{"step":2}`))
	h.one(enq("q", "m1", "payload"))
	good := snapshotFile(t, h)
	if _, err := CheckBackupFile(good); err != nil {
		t.Fatalf("intact snapshot: %v", err)
	}
	raw, _ := os.ReadFile(good)
	damaged := func(what string, change func(tx *bolt.Tx) error) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "damaged.db")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(change); err != nil {
			t.Fatal(err)
		}
		db.Close()
		if _, err := CheckStateFile(path); err != nil {
			t.Errorf("%s: %v from the check of a Raft snapshot, which leaves contents to the checksum", what, err)
		}
		if _, err := CheckBackupFile(path); !errors.Is(err, errcode.InvalidSnapshot) {
			t.Errorf("%s: %v, want invalid_snapshot", what, err)
		}
	}
	docKey := keyOf("default", "doc")
	damaged("a document that is not JSON", func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDocs).Put(docKey, []byte(`{"step"x1}`))
	})
	damaged("a document of the same size that is not the one its etag names", func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDocs).Put(docKey, []byte(`{"step":9}`))
	})
	damaged("a document gone", func(tx *bolt.Tx) error { return tx.Bucket(bucketDocs).Delete(docKey) })
	damaged("a document without a record saying so", func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDocs).Put(keyOf("default", "staged"), []byte(`{}`))
	})
	damaged("a staged document that is not the one its etag names", func(tx *bolt.Tx) error {
		b := tx.Bucket(staging.Bucket)
		k, v := b.Cursor().First()
		return b.Put(k, []byte(strings.Replace(string(v), `{"step":2}`, `{"step":3}`, 1)))
	})
	damaged("a payload cut short", func(tx *bolt.Tx) error {
		return tx.Bucket(bucketQBodies).Put(msgKey("default", "q", "m1"), []byte("pay"))
	})
}

// pageFixture is a state file with branch pages, overflow pages and
// nested buckets, and the pages it uses.
type pageFixture struct {
	t     *testing.T
	dir   string
	raw   []byte
	inUse map[uint64]bool
}

const fixturePageSize = 4096

func newPageFixture(t *testing.T) *pageFixture {
	h := openHarness(t, t.TempDir())
	for i := range 300 {
		l := mustLease(t, h.one(acq("key-"+strconv.Itoa(i), "t"+strconv.Itoa(i), "r"+strconv.Itoa(i), 60_000, 0)))
		doc := `{"n":` + strconv.Itoa(i) + `,"pad":"` + strings.Repeat("p", 64) + `"}`
		if i%100 == 0 {
			doc = `{"n":` + strconv.Itoa(i) + `,"pad":"` + strings.Repeat("p", 20_000) + `"}` // overflow pages
		}
		h.one(update(l, doc))
		h.one(release(l, false))
	}
	raw, _ := os.ReadFile(snapshotFile(t, h))
	fx := &pageFixture{t: t, dir: t.TempDir(), raw: raw}
	if err := fx.check("intact", raw); err != nil {
		t.Fatalf("intact file: %v", err)
	}
	fx.inUse = fx.pagesInUse("intact")
	return fx
}

// pagesInUse walks the file written as name.
func (fx *pageFixture) pagesInUse(name string) (inUse map[uint64]bool) {
	db, err := bolt.Open(filepath.Join(fx.dir, name), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		fx.t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bolt.Tx) (err error) { inUse, err = walkPages(tx); return err }); err != nil {
		fx.t.Fatal(err)
	}
	return inUse
}

// pages returns the offsets of the pages in use with the given flags.
func (fx *pageFixture) pages(flags uint16) []int {
	var out []int
	for off := 2 * fixturePageSize; off+fixturePageSize <= len(fx.raw); off += fixturePageSize {
		if fx.inUse[uint64(off/fixturePageSize)] && binary.LittleEndian.Uint16(fx.raw[off+8:]) == flags {
			out = append(out, off)
		}
	}
	if len(out) == 0 {
		fx.t.Fatalf("no page of kind %#x in the file: make it larger", flags)
	}
	return out
}

// check writes data as name and checks it, failing the test if the check
// does not end.
func (fx *pageFixture) check(name string, data []byte) error {
	fx.t.Helper()
	p := filepath.Join(fx.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		fx.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := CheckStateFile(p); done <- err }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		fx.t.Fatalf("%s: the check did not end", name)
	}
	return nil
}

// A branch element damaged to point back at its own page would send bbolt
// round the loop until memory ran out; so would two elements naming one
// page. Both are refused before bbolt walks the file. An intact file with
// overflow pages and nested buckets passes.
func TestCheckStateFileRefusesPageLoops(t *testing.T) {
	fx := newPageFixture(t)
	for _, off := range fx.pages(branchPageFlag) {
		self := bytes.Clone(fx.raw)
		copy(self[off+pageHeaderSize+8:], fx.raw[off:off+8]) // element 0 points at its own page
		if err := fx.check("self", self); !errors.Is(err, errcode.InvalidSnapshot) {
			t.Fatalf("branch page %d pointing at itself: %v", off/fixturePageSize, err)
		}
		if binary.LittleEndian.Uint16(fx.raw[off+10:]) < 2 {
			continue
		}
		twice := bytes.Clone(fx.raw)
		copy(twice[off+pageHeaderSize+pageElementSize+8:], fx.raw[off+pageHeaderSize+8:off+pageHeaderSize+16])
		if err := fx.check("twice", twice); !errors.Is(err, errcode.InvalidSnapshot) {
			t.Fatalf("branch page %d naming one child twice: %v", off/fixturePageSize, err)
		}
	}
}

// A key out of order is refused: opening such a file for writing (as a
// restore does) makes bbolt rebuild its freelist in a goroutine of its own
// that panics on it, and no recover can catch that.
func TestCheckStateFileRefusesKeysOutOfOrder(t *testing.T) {
	fx := newPageFixture(t)
	for _, off := range fx.pages(leafPageFlag) {
		e := fx.raw[off+pageHeaderSize:]
		pos, ksize := binary.LittleEndian.Uint32(e[4:]), binary.LittleEndian.Uint32(e[8:])
		if ksize == 0 || binary.LittleEndian.Uint16(fx.raw[off+10:]) < 2 {
			continue
		}
		bad := bytes.Clone(fx.raw)
		bad[off+pageHeaderSize+int(pos)] = 0xff // the first key now sorts after the second
		if err := fx.check("order", bad); !errors.Is(err, errcode.InvalidSnapshot) {
			t.Fatalf("leaf page %d with its first key out of order: %v", off/fixturePageSize, err)
		}
	}
}

// A stored freelist that lists a page in use is refused: bbolt would hand
// that page out again and a restore's first write would overwrite live
// data.
func TestCheckStateFileRefusesAFreelistOfPagesInUse(t *testing.T) {
	fx := newPageFixture(t)
	// Store a freelist: open the file for writing as bbolt does by default.
	p := filepath.Join(fx.dir, "with-freelist")
	if err := os.WriteFile(p, fx.raw, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(p, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put([]byte("x"), []byte("y")) }); err != nil {
		t.Fatal(err)
	}
	var freelist uint64
	_ = db.View(func(tx *bolt.Tx) (err error) {
		w := &pageWalk{pageSize: fixturePageSize}
		if w.f, err = os.Open(p); err == nil {
			freelist, err = w.freelistPage(uint64(tx.ID()), uint64(tx.Cursor().Bucket().Root()))
			w.f.Close()
		}
		return err
	})
	db.Close()
	stored, _ := os.ReadFile(p)
	if freelist == noFreelist || freelist == 0 {
		t.Fatal("the file has no stored freelist")
	}
	if err := fx.check("with-freelist", stored); err != nil {
		t.Fatalf("a file with a sound freelist: %v", err)
	}
	inUse := fx.pagesInUse("with-freelist")
	var live uint64
	for id := range inUse {
		if id != freelist && (live == 0 || id < live) {
			live = id
		}
	}
	off := int(freelist) * fixturePageSize
	binary.LittleEndian.PutUint16(stored[off+10:], 1)
	binary.LittleEndian.PutUint64(stored[off+pageHeaderSize:], live)
	if err := fx.check("bad-freelist", stored); !errors.Is(err, errcode.InvalidSnapshot) {
		t.Fatalf("a freelist listing page %d, which is in use: %v", live, err)
	}
}

// Random damage to data pages: either still readable or rejected. Under
// the race detector, bbolt's pointer arithmetic over a damaged page can
// trip checkptr, a fatal error no recover sees, so this runs without it
// (.ci/run runs it so).
func TestCheckStateFileSurvivesRandomDamage(t *testing.T) {
	if raceEnabled {
		t.Skip("skipped under -race: checkptr makes reading a damaged page fatal; .ci/run runs this test without -race")
	}
	h := openHarness(t, t.TempDir())
	for i := range 300 {
		l := mustLease(t, h.one(acq("key-"+strconv.Itoa(i), "t"+strconv.Itoa(i), "r"+strconv.Itoa(i), 60_000, 0)))
		h.one(update(l, `{"n":`+strconv.Itoa(i)+`,"pad":"`+string(make([]byte, 64))+`"}`))
		h.one(release(l, false))
	}
	raw, _ := os.ReadFile(snapshotFile(t, h))
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 50 {
		bad := append([]byte(nil), raw...)
		for range 1 + rng.IntN(8) {
			off := 2*4096 + rng.IntN(len(bad)-2*4096)
			bad[off] = byte(rng.IntN(256))
		}
		p := filepath.Join(dir, "flip"+strconv.Itoa(i))
		if err := os.WriteFile(p, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := CheckStateFile(p); err != nil && !errors.Is(err, errcode.InvalidSnapshot) {
			t.Fatalf("damaged file %d: %v, want invalid_snapshot or success", i, err)
		}
	}
}

// PrepareRestore raises fencing counters, the replicated clock and the
// voter high-water mark to the current state's and keeps the island's
// backend hash; the rest is the backup's.
func TestPrepareRestoreKeepsFencingTokensGrowing(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "island-a"}})
	l := mustLease(t, h.one(acq("a", "t1", "r1", 60_000, 0)))
	h.one(update(l, `{"v":1}`))
	h.one(release(l, false))
	backup := snapshotFile(t, h)

	// Later: a is granted twice more and a new key b appears.
	for i := 2; i <= 3; i++ {
		h.now += 1000
		l := mustLease(t, h.one(acq("a", "t"+strconv.Itoa(i), "r"+strconv.Itoa(i), 60_000, 0)))
		h.one(update(l, `{"v":`+strconv.Itoa(i)+`}`))
		h.one(release(l, false))
	}
	mustLease(t, h.one(acq("b", "tb", "rb", 60_000, 0)))
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Voters: 5}})
	now := h.f.Now()

	dst := openHarness(t, t.TempDir())
	dst.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "island-b"}})
	restoreInto(t, h, dst, backup)
	if d := dst.publicDoc("a"); string(d.Bytes) != `{"v":1}` || d.Version != 1 {
		t.Fatalf("a after restore: %+v", d)
	}
	if dst.f.Now() != now || dst.f.BackendHash() != "island-a" {
		t.Fatalf("clock %d (want %d), backend %q (want the restoring island's)", dst.f.Now(), now, dst.f.BackendHash())
	}
	var voters int
	_ = dst.f.View(func(v *View) error { voters = v.MaxVoters(); return nil })
	if voters != 5 {
		t.Fatalf("the voter high-water mark went back to %d after the restore, want 5", voters)
	}
	dst.index, dst.now = dst.f.Applied(), now+1000
	if la := mustLease(t, dst.one(acq("a", "t9", "r9", 60_000, 0))); la.Token != 4 {
		t.Fatalf("a's next token after restore = %d, want 4", la.Token)
	}
	if lb := mustLease(t, dst.one(acq("b", "t10", "r10", 60_000, 0))); lb.Token != 2 {
		t.Fatalf("b (absent from the backup) got token %d, want 2", lb.Token)
	}
}

// A backup restored into another island keeps that island's identity: the
// registry entry the backup holds for the island it came from is not taken
// for a peer island, and the restoring island's own entry is its current
// one.
func TestPrepareRestoreKeepsTheIslandsOwnRegistryEntry(t *testing.T) {
	register := func(h *harness, backend, endpoint string) {
		t.Helper()
		h.one(&Command{Op: OpRMRegister, RMRegister: &RMRegisterCmd{Backend: backend, Endpoint: endpoint}})
	}
	src := openHarness(t, t.TempDir())
	src.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "island-a"}})
	register(src, "island-a", "https://a1:9341")
	register(src, "island-c", "https://c1:9341")
	backup := snapshotFile(t, src)

	dst := openHarness(t, t.TempDir())
	dst.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "island-b"}})
	register(dst, "island-b", "https://b1:9341")
	restoreBackup(t, dst, backup)
	var rms map[string]RMEntry
	_ = dst.f.View(func(v *View) error { rms = v.RMs(); return nil })
	if _, ok := rms["island-a"]; ok {
		t.Errorf("the backup's own island is a peer after the restore: %v", rms)
	}
	if e := rms["island-b"]; !slices.Equal(e.Endpoints, []string{"https://b1:9341"}) {
		t.Errorf("the restoring island's own entry is %v, want its current endpoints", e.Endpoints)
	}
	if e := rms["island-c"]; !slices.Equal(e.Endpoints, []string{"https://c1:9341"}) {
		t.Errorf("a peer island of the backup is %v after the restore", e.Endpoints)
	}
}

// restoreBackup prepares the backup file at path and installs it as h's
// state, as an operator's restore does.
func restoreBackup(t *testing.T, h *harness, path string) { restoreInto(t, h, h, path) }

// restoreInto restores the backup at path, prepared by the current state of
// src (PrepareRestore), into dst.
func restoreInto(t *testing.T, src, dst *harness, path string) {
	t.Helper()
	if err := src.f.PrepareRestore(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dst.f.Restore(f); err != nil {
		t.Fatal(err)
	}
	dst.index = dst.f.Applied()
}

// A restore never lowers the rules the island follows: a backup taken
// before the island adopted this build's format is restored under them.
// A state file that follows rules newer than this build's is refused.
func TestRestoreKeepsTheRulesAndRefusesNewerOnes(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("k", "t1", "r1", 60_000, 0)))
	h.one(release(l, false))
	old := snapshotFile(t, h)
	h.one(adoptRules())
	restoreBackup(t, h, old)
	if got := h.f.Rules(); got != EntryFormat {
		t.Fatalf("rules after restoring a backup of rules %d: %d, want %d", formatV1, got, EntryFormat)
	}

	newer := snapshotFile(t, h)
	db, err := bolt.Open(newer, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaRules, putU64(EntryFormat+1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckBackupFile(newer); !errors.Is(err, errcode.InvalidSnapshot) || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("a state of newer rules: %v, want invalid_snapshot saying to upgrade", err)
	}
}

// The island's backend hash is read from the entry that names it (alone or
// packed) and from a state file, opened read-only; entries that name no
// island, or that set_backend rejects, name none.
func TestTheIslandIsNamedByItsFirstSetBackend(t *testing.T) {
	enc := func(c *Command) []byte {
		data, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	setBackend := func(hash string, voters int) *Command {
		return &Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: hash, Voters: voters}}
	}
	noop := enc(&Command{Op: OpNoop, Noop: &NoopCmd{}})
	for _, c := range []struct {
		data []byte
		want string
	}{
		{enc(setBackend("island-a", 0)), "island-a"},
		{enc(setBackend("", 3)), ""},
		{enc(setBackend(strings.Repeat("x", 129), 0)), ""},
		{noop, ""},
		{EncodePacked([][]byte{noop, enc(setBackend("island-b", 0))}), "island-b"},
		{[]byte("garbage"), ""},
		{nil, ""},
	} {
		if got := EntryBackend(c.data); got != c.want {
			t.Errorf("EntryBackend(%q) = %q, want %q", c.data, got, c.want)
		}
	}

	h := openHarness(t, t.TempDir())
	h.run(setBackend("island-a", 0), setBackend("island-b", 0))
	backend, applied, err := StateBackend(snapshotFile(t, h))
	if err != nil || backend != "island-a" || applied != h.f.Applied() {
		t.Fatalf("StateBackend = %q, %d, %v; want island-a, %d", backend, applied, err, h.f.Applied())
	}
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("not a state file"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := StateBackend(other); !errors.Is(err, errcode.InvalidSnapshot) {
		t.Fatalf("StateBackend of another file: %v", err)
	}
}
