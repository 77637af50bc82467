package fsm

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
)

func revokeCmd(serial, reason string) *Command {
	return &Command{Op: OpRevoke, Revoke: &RevokeCmd{Serial: serial, Reason: reason}}
}

func trustCmd(fp, name string, cert []byte) *Command {
	return &Command{Op: OpTrust, Trust: &TrustCmd{Fingerprint: fp, Name: name, Cert: cert}}
}

func untrustCmd(fp string) *Command {
	return &Command{Op: OpTrust, Trust: &TrustCmd{Fingerprint: fp, Remove: true}}
}

// fp is a well-formed fingerprint made of one repeated hex digit.
func fp(digit string) string { return strings.Repeat(digit, 64) }

func (h *harness) revocations() (out []Revocation) {
	_ = h.f.View(func(v *View) error { out = v.Revocations(); return nil })
	return out
}

func (h *harness) trusted() (out []TrustedCA) {
	_ = h.f.View(func(v *View) error { out = v.TrustedCAs(); return nil })
	return out
}

func TestRevokeIsIdempotent(t *testing.T) {
	h := openHarness(t, t.TempDir())
	gen := h.f.AuthGeneration()
	r := h.one(revokeCmd("1f2e", "key lost"))
	if r.Err != nil || r.Auth == nil || !r.Auth.Changed {
		t.Fatalf("first revocation: %+v", r)
	}
	want := Revocation{Serial: "1f2e", Reason: "key lost", RevokedAt: h.now}
	if *r.Auth.Revocation != want {
		t.Fatalf("entry %+v, want %+v", *r.Auth.Revocation, want)
	}
	if h.f.AuthGeneration() == gen {
		t.Fatal("the generation did not move after a revocation")
	}
	gen, before := h.f.AuthGeneration(), h.hashWithoutMeta()
	h.now += 5000
	r = h.one(revokeCmd("1f2e", "another reason"))
	if r.Err != nil || r.Auth.Changed || *r.Auth.Revocation != want {
		t.Fatalf("second revocation of the serial: %+v (entry %+v)", r, r.Auth.Revocation)
	}
	if h.f.AuthGeneration() != gen || !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("revoking a revoked serial changed something")
	}
	if got := h.revocations(); len(got) != 1 || got[0] != want {
		t.Fatalf("denylist %+v", got)
	}
}

func TestTrustAddAndRemove(t *testing.T) {
	h := openHarness(t, t.TempDir())
	cert := []byte("der bytes of a CA")
	gen := h.f.AuthGeneration()
	r := h.one(trustCmd(fp("a"), "island b", cert))
	if r.Err != nil || !r.Auth.Changed || r.Auth.Trust == nil || r.Auth.Trust.Name != "island b" || r.Auth.Trust.AddedAt != h.now {
		t.Fatalf("add: %+v", r)
	}
	if h.f.AuthGeneration() == gen {
		t.Fatal("the generation did not move after an addition")
	}

	// Adding again changes nothing and reports the entry as it was.
	gen, before, added := h.f.AuthGeneration(), h.hashWithoutMeta(), h.now
	h.now += 1000
	r = h.one(trustCmd(fp("a"), "renamed", []byte("other bytes")))
	if r.Err != nil || r.Auth.Changed || r.Auth.Trust.Name != "island b" || r.Auth.Trust.AddedAt != added {
		t.Fatalf("add again: %+v", r)
	}
	if h.f.AuthGeneration() != gen || !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("adding a trusted CA again changed something")
	}

	h.one(trustCmd(fp("0"), "island c", cert))
	if got := h.trusted(); len(got) != 2 || got[0].Fingerprint != fp("0") || got[1].Fingerprint != fp("a") ||
		!bytes.Equal(got[1].Cert, cert) {
		t.Fatalf("trust list (in fingerprint order): %+v", got)
	}

	gen = h.f.AuthGeneration()
	if r = h.one(untrustCmd(fp("a"))); r.Err != nil || !r.Auth.Changed || r.Auth.Trust.Fingerprint != fp("a") {
		t.Fatalf("remove: %+v", r)
	}
	if h.f.AuthGeneration() == gen {
		t.Fatal("the generation did not move after a removal")
	}
	gen, before = h.f.AuthGeneration(), h.hashWithoutMeta()
	if r = h.one(untrustCmd(fp("a"))); r.Err != nil || r.Auth.Changed || r.Auth.Trust != nil {
		t.Fatalf("remove again: %+v", r)
	}
	if r = h.one(untrustCmd(fp("b"))); r.Err != nil || r.Auth.Changed {
		t.Fatalf("remove an unknown CA: %+v", r)
	}
	if h.f.AuthGeneration() != gen || !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("removing an absent CA changed something")
	}
	if got := h.trusted(); len(got) != 1 || got[0].Fingerprint != fp("0") {
		t.Fatalf("trust list after removal: %+v", got)
	}
}

func TestBadAccessListCommandsAreRejected(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(revokeCmd("ab", ""))
	h.one(trustCmd(fp("c"), "c", []byte("ca")))
	for name, c := range map[string]*Command{
		"revoke without a serial":         revokeCmd("", "x"),
		"revoke an upper-case serial":     revokeCmd("AB", ""),
		"revoke a serial that is no hex":  revokeCmd("xyz", ""),
		"revoke a serial with colons":     revokeCmd("ab:cd", ""),
		"revoke a serial too long":        revokeCmd(strings.Repeat("1", 65), ""),
		"revoke with a reason too long":   revokeCmd("cd", strings.Repeat("r", 257)),
		"trust a short fingerprint":       trustCmd(strings.Repeat("a", 63), "x", []byte("ca")),
		"trust a long fingerprint":        trustCmd(strings.Repeat("a", 65), "x", []byte("ca")),
		"trust an upper-case fingerprint": trustCmd(strings.Repeat("A", 64), "x", []byte("ca")),
		"trust without a certificate":     trustCmd(fp("d"), "x", nil),
		"trust a certificate too large":   trustCmd(fp("d"), "x", make([]byte, 16<<10+1)),
		"trust with a name too long":      trustCmd(fp("d"), strings.Repeat("n", 257), []byte("ca")),
		"untrust a bad fingerprint":       untrustCmd("c"),
	} {
		gen, before := h.f.AuthGeneration(), h.hashWithoutMeta()
		r := h.one(c)
		if !errorsIsCode(r, errcode.MalformedCmd) {
			t.Errorf("%s: %+v, want %s", name, r, errcode.MalformedCmd.Code)
		}
		if h.f.AuthGeneration() != gen || !bytes.Equal(before, h.hashWithoutMeta()) {
			t.Errorf("%s: the rejected command changed the state", name)
		}
	}
	if got := h.revocations(); len(got) != 1 || got[0].Serial != "ab" {
		t.Fatalf("denylist %+v", got)
	}
	if got := h.trusted(); len(got) != 1 || got[0].Fingerprint != fp("c") {
		t.Fatalf("trust list %+v", got)
	}
}

func errorsIsCode(r *Result, code *errcode.Error) bool {
	return r != nil && r.Err != nil && r.Err.Code == code.Code
}

// Access-list commands survive encoding (the certificate is binary).
func TestAccessListCommandsRoundTrip(t *testing.T) {
	cert := []byte{0, 1, 2, '\n', 0xff, '"'}
	for _, c := range []*Command{revokeCmd("ff00", "why\nnot"), trustCmd(fp("e"), "ïsland", cert), untrustCmd(fp("e"))} {
		raw, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(raw)
		if err != nil {
			t.Fatalf("%s: %v", c.Op, err)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("%s: decoded %+v, want %+v", c.Op, back, c)
		}
	}
}

// The same log gives the same lists whatever the batches it was applied in.
func TestAccessListsApplyDeterministically(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	var logs []*raft.Log
	now := int64(1_000_000)
	digits := "0123456789abcdef"
	for i := range 300 {
		now += rng.Int64N(1000)
		d := string(digits[rng.IntN(4)])
		var c *Command
		switch rng.IntN(4) {
		case 0:
			c = revokeCmd(strings.Repeat(d, 1+rng.IntN(3)), "r")
		case 1:
			c = trustCmd(fp(d), "ca "+d, []byte("cert "+d))
		case 2:
			c = untrustCmd(fp(d))
		default:
			c = revokeCmd("Bad", "") // rejected
		}
		c.Now = now
		logs = append(logs, logOf(t, uint64(i+1), c))
	}
	a, b := openHarness(t, t.TempDir()), openHarness(t, t.TempDir())
	for _, l := range logs {
		a.f.ApplyBatch([]*raft.Log{l})
	}
	for i := 0; i < len(logs); {
		n := min(1+rng.IntN(40), len(logs)-i)
		b.f.ApplyBatch(logs[i : i+n])
		i += n
	}
	if !bytes.Equal(a.hash(), b.hash()) {
		t.Fatalf("seed %d: the lists differ between one-by-one and batched apply", seed)
	}
	if !reflect.DeepEqual(a.revocations(), b.revocations()) || !reflect.DeepEqual(a.trusted(), b.trusted()) {
		t.Fatalf("seed %d: the lists read differently", seed)
	}
}

func TestAccessListsSurviveSnapshotAndRestore(t *testing.T) {
	src := openHarness(t, t.TempDir())
	src.one(revokeCmd("beef", "stolen"))
	src.one(revokeCmd("1", ""))
	src.one(trustCmd(fp("9"), "island b", []byte("der")))
	data := snapshotBytes(t, src)

	dst := openHarness(t, t.TempDir())
	dst.one(revokeCmd("dead", "")) // replaced by the restore
	gen := dst.f.AuthGeneration()
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	if dst.f.AuthGeneration() == gen {
		t.Fatal("a restore did not move the generation: cached lists would stay stale")
	}
	if !reflect.DeepEqual(dst.revocations(), src.revocations()) || !reflect.DeepEqual(dst.trusted(), src.trusted()) {
		t.Fatalf("restored lists %+v %+v, want %+v %+v", dst.revocations(), dst.trusted(), src.revocations(), src.trusted())
	}
	if !bytes.Equal(src.hash(), dst.hash()) {
		t.Fatal("restored state differs from the source")
	}
	// The restored state machine goes on applying access-list commands.
	dst.index = dst.f.Applied()
	if r := dst.one(revokeCmd("beef", "")); r.Err != nil || r.Auth.Changed {
		t.Fatalf("revoking a serial revoked before the snapshot: %+v", r)
	}
}

// An operator's restore of a backup taken before a certificate was revoked
// does not let the certificate back in: PrepareRestore keeps the current
// denylist's entries, besides the backup's own.
func TestPrepareRestoreKeepsRevocations(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(revokeCmd("1", "old"))
	backup := snapshotFile(t, h)
	h.one(revokeCmd("beef", "stolen"))
	want := h.revocations()

	restoreBackup(t, h, backup)
	if got := h.revocations(); !reflect.DeepEqual(got, want) {
		t.Fatalf("denylist after restoring an older backup: %+v, want %+v", got, want)
	}
}

// An operator's restore of a backup taken while a CA was trusted does not
// trust it again once it was removed (it may have been compromised); a CA
// added back after its removal is the backup's as usual, a cluster that
// never removed the CA restores it, and the removal is kept for later
// restores.
func TestPrepareRestoreLeavesOutRemovedCAs(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(trustCmd(fp("1"), "island b", []byte("der-b")))
	h.one(trustCmd(fp("2"), "island c", []byte("der-c")))
	h.one(trustCmd(fp("3"), "island d", []byte("der-d")))
	raw := snapshotBytes(t, h)
	h.one(untrustCmd(fp("1")))
	h.one(untrustCmd(fp("3")))
	h.one(trustCmd(fp("3"), "island d again", []byte("der-d")))

	restore := func(into *harness) *harness {
		path := filepath.Join(t.TempDir(), "backup.db")
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		restoreBackup(t, into, path)
		return into
	}
	names := func(h *harness) (out []string) {
		for _, ca := range h.trusted() {
			out = append(out, ca.Name)
		}
		return out
	}
	restored := restore(h)
	if got, want := names(restored), []string{"island c", "island d"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("trust list after restoring an older backup: %q, want %q", got, want)
	}
	if got, want := names(restore(restored)), []string{"island c", "island d"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("trust list after restoring the backup again: %q, want %q", got, want)
	}
	if got, want := names(restore(openHarness(t, t.TempDir()))), []string{"island b", "island c", "island d"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("trust list restored by a cluster that removed nothing: %q, want %q", got, want)
	}
}
