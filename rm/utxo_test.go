package rm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// fsmStore applies commands straight to a real state machine (one bbolt
// file), one entry at a time, with a clock the test moves: the UTXO rules
// and the creation protocol without a Raft group around them.
type fsmStore struct {
	mu    sync.Mutex
	f     *fsm.FSM
	index uint64
	now   int64
	// refuse, when set, fails a command before it is applied (a lost
	// leader, a cancelled request).
	refuse func(cmd *fsm.Command) error
}

func newFSMStore(t *testing.T) *fsmStore {
	t.Helper()
	f, err := fsm.Open(filepath.Join(t.TempDir(), "state.db"), fsm.Options{BootID: "b",
		Fatal: func(err error) { t.Errorf("state machine stopped: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	s := &fsmStore{f: f, now: 1_700_000_000_000}
	if _, err := s.Propose(context.Background(), &fsm.Command{Op: fsm.OpSetBackend, SetBackend: &fsm.SetBackendCmd{Hash: "island-a"}}); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *fsmStore) Propose(_ context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse != nil {
		if err := s.refuse(cmd); err != nil {
			return nil, err
		}
	}
	cmd.Now = s.now
	data, err := fsm.Encode(cmd)
	if err != nil {
		return nil, err
	}
	s.index++
	res := s.f.Apply(&raft.Log{Index: s.index, Term: 1, Type: raft.LogCommand, Data: data}).(*fsm.Result)
	return res, res.Error()
}

func (s *fsmStore) Read(_ context.Context, fn func(v *fsm.View) error) error { return s.f.View(fn) }
func (s *fsmStore) ReadStale(_ context.Context, fn func(v *fsm.View) error) error {
	return s.f.View(fn)
}
func (s *fsmStore) BackendHash() string { return s.f.BackendHash() }

func (s *fsmStore) advance(ms int64) {
	s.mu.Lock()
	s.now += ms
	s.mu.Unlock()
}

func (s *fsmStore) sweep(t *testing.T) {
	t.Helper()
	if _, err := s.Propose(context.Background(), &fsm.Command{Op: fsm.OpSweep, Sweep: &fsm.SweepCmd{Limit: 1000, TxnRetention: 600_000}}); err != nil {
		t.Fatal(err)
	}
}

func (s *fsmStore) decide(t *testing.T, txn, state string) {
	t.Helper()
	if _, err := s.Propose(context.Background(), &fsm.Command{Op: fsm.OpTxnDecide, Decide: &fsm.DecideCmd{TxnID: txn, State: state}}); err != nil {
		t.Fatal(err)
	}
}

func h32(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

type utxoFixture struct {
	t     *testing.T
	store *fsmStore
	u     *UTXOs
	ctx   context.Context
}

func newUTXOFixture(t *testing.T, batch int) *utxoFixture {
	s := newFSMStore(t)
	return &utxoFixture{t: t, store: s, u: NewUTXOs(s, s, UTXOLimits{BatchSize: batch}), ctx: context.Background()}
}

// tx builds a create request for n outputs of tx name: output i has hash
// h32(name/i) and i+1 satoshis.
func tx(name string, n int) wire.UTXOCreateRequest {
	req := wire.UTXOCreateRequest{TxID: h32(name)}
	for i := 0; i < n; i++ {
		req.Outputs = append(req.Outputs, wire.UTXOOutput{Vout: uint32(i), UTXOHash: h32(fmt.Sprintf("%s/%d", name, i)), Satoshis: uint64(i + 1)})
	}
	return req
}

func sp(name string, vout int, child string, vin int) wire.UTXOSpend {
	return wire.UTXOSpend{TxID: h32(name), Vout: uint32(vout), UTXOHash: h32(fmt.Sprintf("%s/%d", name, vout)),
		SpendingTxID: h32(child), Vin: uint32(vin)}
}

func op(name string, vout int) wire.UTXOOutpoint {
	return wire.UTXOOutpoint{TxID: h32(name), Vout: uint32(vout), UTXOHash: h32(fmt.Sprintf("%s/%d", name, vout))}
}

func (f *utxoFixture) create(req wire.UTXOCreateRequest) {
	f.t.Helper()
	if _, err := f.u.Create(f.ctx, req); err != nil {
		f.t.Fatalf("create %s: %v", req.TxID[:8], err)
	}
}

func (f *utxoFixture) get(name string) *wire.UTXOTx {
	f.t.Helper()
	tx, err := f.u.Get(f.ctx, h32(name), Linearizable)
	if err != nil {
		f.t.Fatalf("get %s: %v", name, err)
	}
	return tx
}

func (f *utxoFixture) height(h uint32) {
	f.t.Helper()
	if _, err := f.u.SetHeight(f.ctx, wire.UTXOHeightRequest{BlockHeight: h}); err != nil {
		f.t.Fatal(err)
	}
}

// items returns the per-item codes of a failed UTXO operation.
func items(t *testing.T, err error, want *errcode.Error) []errcode.Item {
	t.Helper()
	var e *errcode.Error
	if !errors.As(err, &e) || e.Code != want.Code {
		t.Fatalf("error %v, want %s", err, want.Code)
	}
	if want.Code == errcode.UTXOSpendFailed.Code {
		return e.Spends
	}
	return e.Outpoints
}

// spendCode spends one output and returns the code it fails with ("" on
// success).
func (f *utxoFixture) spendCode(s wire.UTXOSpend, opts ...func(*wire.UTXOSpendRequest)) string {
	f.t.Helper()
	req := wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{s}}
	for _, o := range opts {
		o(&req)
	}
	_, err := f.u.Spend(f.ctx, req)
	if err == nil {
		return ""
	}
	it := items(f.t, err, errcode.UTXOSpendFailed)
	if len(it) != 1 || it[0].Index != 0 {
		f.t.Fatalf("spend failures %+v", it)
	}
	return it[0].Code
}

func (f *utxoFixture) outpointCode(fn func(context.Context, wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error), p wire.UTXOOutpoint) string {
	f.t.Helper()
	_, err := fn(f.ctx, wire.UTXOOutpointsRequest{Outpoints: []wire.UTXOOutpoint{p}})
	if err == nil {
		return ""
	}
	return items(f.t, err, errcode.UTXOUpdateFailed)[0].Code
}

func ignoreConflicting(r *wire.UTXOSpendRequest) { r.IgnoreConflicting = true }
func ignoreLocked(r *wire.UTXOSpendRequest)      { r.IgnoreLocked = true }

func TestUTXOSpendRules(t *testing.T) {
	f := newUTXOFixture(t, 0)
	f.create(tx("parent", 3))

	if c := f.spendCode(sp("nobody", 0, "child", 0)); c != wire.UTXOTxNotFound {
		t.Fatalf("unknown tx: %q", c)
	}
	if c := f.spendCode(sp("parent", 3, "child", 0)); c != wire.UTXONotFound {
		t.Fatalf("vout out of range: %q", c)
	}
	bad := sp("parent", 0, "child", 0)
	bad.UTXOHash = h32("other")
	if c := f.spendCode(bad); c != wire.UTXOHashMismatch {
		t.Fatalf("wrong hash: %q", c)
	}

	// Spend, then the same spend again: success, nothing changes.
	if c := f.spendCode(sp("parent", 0, "child", 1)); c != "" {
		t.Fatalf("spend: %q", c)
	}
	before := f.get("parent")
	if c := f.spendCode(sp("parent", 0, "child", 1)); c != "" {
		t.Fatalf("same spend again: %q", c)
	}
	if after := f.get("parent"); after.SpentOutputs != 1 || !slices.EqualFunc(before.Outputs, after.Outputs, sameOutput) {
		t.Fatalf("a repeated spend changed the record: %+v -> %+v", before, after)
	}
	out := before.Outputs[0]
	if out.SpendingTxID != h32("child") || out.Vin == nil || *out.Vin != 1 || len(out.SpendingData) != 72 {
		t.Fatalf("spending data: %+v", out)
	}
	// Another child: SPENT, with the spender that holds it.
	_, err := f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("parent", 0, "thief", 0)}})
	it := items(t, err, errcode.UTXOSpendFailed)
	if it[0].Code != wire.UTXOSpent || it[0].SpendingTxID != h32("child") || it[0].Vin == nil || *it[0].Vin != 1 {
		t.Fatalf("double spend: %+v", it)
	}

	// All or nothing: one failing item leaves the good one unspent.
	_, err = f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("parent", 1, "c2", 0), sp("parent", 0, "c2", 1)}})
	if it := items(t, err, errcode.UTXOSpendFailed); len(it) != 1 || it[0].Index != 1 || it[0].Code != wire.UTXOSpent {
		t.Fatalf("mixed spend: %+v", it)
	}
	if got := f.get("parent"); got.Outputs[1].SpendingTxID != "" || got.SpentOutputs != 1 {
		t.Fatalf("a rejected spend spent output 1: %+v", got.Outputs[1])
	}
	// The same outpoint twice in one request for two children: the second
	// finds it spent by the first, and nothing happens.
	_, err = f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("parent", 1, "c3", 0), sp("parent", 1, "c4", 0)}})
	if it := items(t, err, errcode.UTXOSpendFailed); len(it) != 1 || it[0].Index != 1 || it[0].SpendingTxID != h32("c3") {
		t.Fatalf("one outpoint twice: %+v", it)
	}

	// Frozen: FROZEN, and freezing a spent output is SPENT.
	if c := f.outpointCode(f.u.Freeze, op("parent", 2)); c != "" {
		t.Fatalf("freeze: %q", c)
	}
	if c := f.spendCode(sp("parent", 2, "child", 2)); c != wire.UTXOFrozen {
		t.Fatalf("spend of a frozen output: %q", c)
	}

	// Transaction flags, in order, and the ignore switches.
	f.create(tx("flags", 1))
	for _, fn := range []func(context.Context, wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error){f.u.SetConflicting, f.u.SetLocked} {
		if _, err := fn(f.ctx, wire.UTXOFlagRequest{TxIDs: []string{h32("flags")}, Value: true}); err != nil {
			t.Fatal(err)
		}
	}
	if c := f.spendCode(sp("flags", 0, "c", 0)); c != wire.UTXOConflicting {
		t.Fatalf("conflicting and locked: %q", c)
	}
	if c := f.spendCode(sp("flags", 0, "c", 0), ignoreConflicting); c != wire.UTXOLocked {
		t.Fatalf("locked, conflicting ignored: %q", c)
	}
	if c := f.spendCode(sp("flags", 0, "c", 0), ignoreConflicting, ignoreLocked); c != "" {
		t.Fatalf("both ignored: %q", c)
	}
	res, err := f.u.SetLocked(f.ctx, wire.UTXOFlagRequest{TxIDs: []string{h32("flags"), h32("missing")}})
	if err != nil || res.Updated != 1 || !slices.Equal(res.NotFound, []string{h32("missing")}) {
		t.Fatalf("unlock: %+v, %v", res, err)
	}
}

func sameOutput(a, b wire.UTXOTxOutput) bool {
	return a.Vout == b.Vout && a.UTXOHash == b.UTXOHash && a.SpendingTxID == b.SpendingTxID && a.SpendingData == b.SpendingData &&
		a.Frozen == b.Frozen && a.SpendableAtHeight == b.SpendableAtHeight
}

func TestUTXOCoinbaseMaturityBoundary(t *testing.T) {
	f := newUTXOFixture(t, 0)
	cb := tx("coinbase", 1)
	cb.Coinbase, cb.BlockHeight = true, 500
	f.create(cb)
	f.height(599)
	if c := f.spendCode(sp("coinbase", 0, "c", 0)); c != wire.UTXOCoinbaseImmature {
		t.Fatalf("at height 599: %q", c)
	}
	f.height(600)
	if c := f.spendCode(sp("coinbase", 0, "c", 0)); c != "" {
		t.Fatalf("at height 600: %q", c)
	}
}

func TestUTXOFreezeReassignMatrix(t *testing.T) {
	f := newUTXOFixture(t, 0)
	f.create(tx("t", 4))
	f.height(1000)
	if c := f.spendCode(sp("t", 0, "c", 0)); c != "" {
		t.Fatal(c)
	}
	cases := []struct {
		name string
		fn   func(context.Context, wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error)
		p    wire.UTXOOutpoint
		want string
	}{
		{"freeze spent", f.u.Freeze, op("t", 0), wire.UTXOSpent},
		{"unfreeze unfrozen", f.u.Unfreeze, op("t", 1), wire.UTXONotFrozen},
		{"freeze", f.u.Freeze, op("t", 1), ""},
		{"freeze again", f.u.Freeze, op("t", 1), wire.UTXOAlreadyFrozen},
		{"unspend frozen", f.u.Unspend, op("t", 1), wire.UTXOFrozen},
		{"unspend unspent", f.u.Unspend, op("t", 2), ""},
		{"unfreeze", f.u.Unfreeze, op("t", 1), ""},
		{"unspend spent", f.u.Unspend, op("t", 0), ""},
		{"freeze unknown tx", f.u.Freeze, op("none", 0), wire.UTXOTxNotFound},
		{"freeze bad vout", f.u.Freeze, op("t", 9), wire.UTXONotFound},
		{"freeze for reassign", f.u.Freeze, op("t", 3), ""},
	}
	for _, c := range cases {
		if got := f.outpointCode(c.fn, c.p); got != c.want {
			t.Fatalf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := f.get("t"); got.Outputs[0].SpendingTxID != "" || got.SpentOutputs != 0 {
		t.Fatalf("unspend left spending data: %+v", got.Outputs[0])
	}
	reassign := func(vout int, newHash string) error {
		_, err := f.u.Reassign(f.ctx, wire.UTXOReassignRequest{TxID: h32("t"), Vout: uint32(vout),
			UTXOHash: h32(fmt.Sprintf("t/%d", vout)), NewUTXOHash: newHash})
		return err
	}
	if err := reassign(2, h32("new")); items(t, err, errcode.UTXOUpdateFailed)[0].Code != wire.UTXONotFrozen {
		t.Fatalf("reassign of an unfrozen output: %v", err)
	}
	if err := reassign(3, h32("new")); err != nil {
		t.Fatal(err)
	}
	moved := wire.UTXOSpend{TxID: h32("t"), Vout: 3, UTXOHash: h32("new"), SpendingTxID: h32("c"), Vin: 3}
	if c := f.spendCode(sp("t", 3, "c", 3)); c != wire.UTXOHashMismatch {
		t.Fatalf("old hash after reassign: %q", c)
	}
	if got := f.get("t").Outputs[3]; got.SpendableAtHeight != 2000 || got.Frozen {
		t.Fatalf("reassigned output: %+v", got)
	}
	f.height(1999)
	if c := f.spendCode(moved); c != wire.UTXOFrozenUntil {
		t.Fatalf("before 1000 blocks: %q", c)
	}
	f.height(2000)
	if c := f.spendCode(moved); c != "" {
		t.Fatalf("after 1000 blocks: %q", c)
	}
}

// stopAt makes the service stop a creation at step, as a crash would.
func (f *utxoFixture) stopAt(step string) {
	f.u.step = func(_ context.Context, s string) error {
		if s == step {
			return fmt.Errorf("stopped at %s", s)
		}
		return nil
	}
}

func (f *utxoFixture) creating(name string) []int { return f.get(name).RecordsCreating }

func TestUTXOMultiRecordCreation(t *testing.T) {
	f := newUTXOFixture(t, 3)
	big := tx("big", 10) // records of vouts 0-2, 3-5, 6-8, 9

	// Stopped after phase 1: every record creating, nothing spendable,
	// not even in a child record.
	f.stopAt("phase1")
	if _, err := f.u.Create(f.ctx, big); err == nil {
		t.Fatal("the stopped creation succeeded")
	}
	if got := f.creating("big"); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("records creating after phase 1: %v", got)
	}
	if c := f.spendCode(sp("big", 7, "c", 0)); c != wire.UTXOCreating {
		t.Fatalf("spend of a child output: %q", c)
	}
	// A second create while the lock lives: tx_exists, nothing changes.
	f.u.step = nil
	if _, err := f.u.Create(f.ctx, big); !errors.Is(err, errcode.TxExists) {
		t.Fatalf("create under a live lock: %v", err)
	}
	// Once the lock expired, a spend meeting the transaction completes
	// the creation and goes through.
	f.store.advance(UTXOLockTTL(4).Milliseconds() + 1)
	if c := f.spendCode(sp("big", 7, "c", 0)); c != "" {
		t.Fatalf("spend after the lock expired: %q", c)
	}
	if got := f.get("big"); got.Creating || len(got.RecordsCreating) != 0 || got.TotalOutputs != 10 || len(got.Outputs) != 10 {
		t.Fatalf("after recovery: %+v", got)
	}

	// Stopped between the children and the master: children clear, the
	// master creating, and still nothing spendable; a retry completes it
	// and answers tx_exists.
	f.stopAt("children")
	if _, err := f.u.Create(f.ctx, tx("mid", 7)); err == nil {
		t.Fatal("the stopped creation succeeded")
	}
	if got := f.creating("mid"); !slices.Equal(got, []int{0}) {
		t.Fatalf("records creating between the phases: %v", got)
	}
	if c := f.spendCode(sp("mid", 6, "c", 0)); c != wire.UTXOCreating {
		t.Fatalf("spend of a child output while the master creates: %q", c)
	}
	f.u.step = nil
	f.store.advance(UTXOLockTTL(3).Milliseconds() + 1)
	if _, err := f.u.Create(f.ctx, tx("mid", 7)); !errors.Is(err, errcode.TxExists) {
		t.Fatalf("retry that finds every record: %v", err)
	}
	if got := f.creating("mid"); len(got) != 0 {
		t.Fatalf("the retry left records creating: %v", got)
	}

	// A lock left behind by a creator that stopped after the first record:
	// a retry within the TTL is refused; after it the retry writes the
	// missing records and succeeds.
	f.stopAt("record")
	if _, err := f.u.Create(f.ctx, tx("left", 8)); err == nil {
		t.Fatal("the stopped creation succeeded")
	}
	f.u.step = nil
	if _, err := f.u.Create(f.ctx, tx("left", 8)); !errors.Is(err, errcode.TxExists) {
		t.Fatalf("retry under the lock: %v", err)
	}
	f.store.advance(UTXOLockTTL(3).Milliseconds() + 1)
	f.store.sweep(t) // the lock really expires: the sweeper drops it
	if _, err := f.u.Create(f.ctx, tx("left", 8)); err != nil {
		t.Fatalf("retry after the lock expired: %v", err)
	}
	if got := f.get("left"); got.Creating || got.Records != 3 || len(got.Outputs) != 8 {
		t.Fatalf("completed creation: %+v", got)
	}
	if _, err := f.u.Create(f.ctx, tx("left", 8)); !errors.Is(err, errcode.TxExists) {
		t.Fatalf("create of a complete transaction: %v", err)
	}

	// A spend meeting an abandoned creation with records missing cannot
	// complete it and does not stand in the way of the creator's retry.
	f.stopAt("record")
	if _, err := f.u.Create(f.ctx, tx("part", 8)); err == nil {
		t.Fatal("the stopped creation succeeded")
	}
	f.u.step = nil
	f.store.advance(UTXOLockTTL(3).Milliseconds() + 1)
	if c := f.spendCode(sp("part", 0, "c", 0)); c != wire.UTXOCreating {
		t.Fatalf("spend of a partly created transaction: %q", c)
	}
	if _, err := f.u.Create(f.ctx, tx("part", 8)); err != nil {
		t.Fatalf("the creator's retry after a spend met its creation: %v", err)
	}

	// A creation that fails for another reason than a crash (here: the
	// second record cannot be proposed) releases its lock: a retry need
	// not wait for it to expire, and completes the records.
	records := 0
	f.store.refuse = func(cmd *fsm.Command) error {
		if c := cmd.UTXOCreate; c != nil && c.Phase == fsm.UTXOPhaseRecord {
			if records++; records == 2 {
				return errors.New("no leader")
			}
		}
		return nil
	}
	if _, err := f.u.Create(f.ctx, tx("failed", 8)); err == nil {
		t.Fatal("the failed creation succeeded")
	}
	f.store.refuse = nil
	if _, err := f.u.Create(f.ctx, tx("failed", 8)); err != nil {
		t.Fatalf("retry of a failed creation: %v", err)
	}

	// Mined clears creating on every record.
	f.stopAt("phase1")
	_, _ = f.u.Create(f.ctx, tx("mined", 9))
	f.u.step = nil
	if _, err := f.u.SetMined(f.ctx, wire.UTXOMinedRequest{TxIDs: []string{h32("mined")}, BlockID: 7, BlockHeight: 70,
		SubtreeIdx: 2, OnLongestChain: true}); err != nil {
		t.Fatal(err)
	}
	got := f.get("mined")
	if got.Creating || len(got.RecordsCreating) != 0 || got.UnminedSince != nil || !slices.Equal(got.BlockIDs, []uint32{7}) {
		t.Fatalf("after mined: %+v", got)
	}
	if c := f.spendCode(sp("mined", 8, "c", 0)); c != "" {
		t.Fatalf("spend after mined: %q", c)
	}
}

func TestUTXOConcurrentCreates(t *testing.T) {
	f := newUTXOFixture(t, 2)
	for round := 0; round < 20; round++ {
		req := tx(fmt.Sprintf("race-%d", round), 9-round%2*8) // odd rounds: one record
		var wg sync.WaitGroup
		errs := make([]error, 5)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = f.u.Create(f.ctx, req)
			}()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, errcode.TxExists):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d creates succeeded: %v", round, ok, errs)
		}
		if got := f.get(fmt.Sprintf("race-%d", round)); got.Creating || len(got.RecordsCreating) != 0 || len(got.Outputs) != len(req.Outputs) {
			t.Fatalf("round %d left %+v", round, got)
		}
	}
}

func TestUTXOStagedSpendsAndCreates(t *testing.T) {
	f := newUTXOFixture(t, 0)
	f.create(tx("p", 2))
	txn := xid.New().String()
	res, err := f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("p", 0, "a", 0)}, TxnID: txn})
	if err != nil || len(res.Participants) != 1 || res.Participants[0].Namespace != wire.UTXOParticipantNamespace ||
		res.Participants[0].Key != h32("p") || res.Participants[0].BackendHash != "island-a" {
		t.Fatalf("staged spend: %+v, %v", res, err)
	}
	// Reserved: another spender is refused at once, naming the holder.
	if c := f.spendCode(sp("p", 0, "b", 0)); c != wire.UTXOLockedPrefix+txn {
		t.Fatalf("spend of a reserved output: %q", c)
	}
	if got := f.get("p").Outputs[0]; got.ReservedBy != txn || got.SpendingTxID != "" {
		t.Fatalf("reserved output: %+v", got)
	}
	f.store.decide(t, txn, fsm.TxnCommit)
	if got := f.get("p"); got.Outputs[0].SpendingTxID != h32("a") || got.Outputs[0].ReservedBy != "" || got.SpentOutputs != 1 {
		t.Fatalf("after commit: %+v", got.Outputs[0])
	}

	// Rolled back: the output is free again.
	txn2 := xid.New().String()
	if _, err := f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("p", 1, "a", 1)}, TxnID: txn2}); err != nil {
		t.Fatal(err)
	}
	f.store.decide(t, txn2, fsm.TxnRollback)
	if c := f.spendCode(sp("p", 1, "b", 0)); c != "" {
		t.Fatalf("spend after rollback: %q", c)
	}

	// A staged create is invisible to spenders until its commit, and gone
	// after a rollback.
	txn3, txn4 := xid.New().String(), xid.New().String()
	staged := tx("staged", 2)
	staged.TxnID = txn3
	if _, err := f.u.Create(f.ctx, staged); err != nil {
		t.Fatal(err)
	}
	if c := f.spendCode(sp("staged", 0, "c", 0)); c != wire.UTXOLockedPrefix+txn3 {
		t.Fatalf("spend of a staged create: %q", c)
	}
	f.store.decide(t, txn3, fsm.TxnCommit)
	if c := f.spendCode(sp("staged", 0, "c", 0)); c != "" {
		t.Fatalf("spend after the create committed: %q", c)
	}
	gone := tx("gone", 2)
	gone.TxnID = txn4
	if _, err := f.u.Create(f.ctx, gone); err != nil {
		t.Fatal(err)
	}
	f.store.decide(t, txn4, fsm.TxnRollback)
	if _, err := f.u.Get(f.ctx, h32("gone"), Linearizable); !errors.Is(err, errcode.TxNotFound) {
		t.Fatalf("rolled back create: %v", err)
	}

	// A reservation nobody decides expires: the sweeper rolls it back.
	txn5 := xid.New().String()
	f.create(tx("q", 1))
	if _, err := f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("q", 0, "a", 0)}, TxnID: txn5, TTLSeconds: 5}); err != nil {
		t.Fatal(err)
	}
	f.store.advance(5001)
	f.store.sweep(t)
	if c := f.spendCode(sp("q", 0, "b", 0)); c != "" {
		t.Fatalf("spend after the reservation expired: %q", c)
	}
	if _, err := f.u.Spend(f.ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("q", 0, "a", 0)}, TxnID: txn5}); !errors.Is(err, errcode.TxnRolledBack) {
		t.Fatalf("staged spend of an expired transaction: %v", err)
	}
}

func TestUTXOBadInput(t *testing.T) {
	f := newUTXOFixture(t, 0)
	good := tx("x", 2)
	cases := []struct {
		name string
		req  func(r *wire.UTXOCreateRequest)
		want *errcode.Error
	}{
		{"odd hex txid", func(r *wire.UTXOCreateRequest) { r.TxID = r.TxID[:63] }, errcode.InvalidTxID},
		{"non-hex txid", func(r *wire.UTXOCreateRequest) { r.TxID = "zz" + r.TxID[2:] }, errcode.InvalidTxID},
		{"short hash", func(r *wire.UTXOCreateRequest) { r.Outputs[0].UTXOHash = "abcd" }, errcode.InvalidUTXOHash},
		{"duplicate vout", func(r *wire.UTXOCreateRequest) { r.Outputs[1].Vout = 0 }, errcode.DuplicateVout},
		{"no outputs", func(r *wire.UTXOCreateRequest) { r.Outputs = nil }, errcode.InvalidUTXORequest},
		{"too many satoshis", func(r *wire.UTXOCreateRequest) { r.Outputs[0].Satoshis = 1 << 62 }, errcode.InvalidUTXORequest},
		{"ttl without txn", func(r *wire.UTXOCreateRequest) { r.TTLSeconds = 5 }, errcode.InvalidTTL},
		{"bad txn", func(r *wire.UTXOCreateRequest) { r.TxnID = "nope" }, errcode.InvalidTxn},
	}
	for _, c := range cases {
		req := tx("x", 2)
		c.req(&req)
		if _, err := f.u.Create(f.ctx, req); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %s", c.name, err, c.want.Code)
		}
	}
	if _, err := f.u.Get(f.ctx, good.TxID, Linearizable); !errors.Is(err, errcode.TxNotFound) {
		t.Fatalf("bad input created something: %v", err)
	}
	// A record larger than an entry may be is refused before anything is
	// written.
	small := NewUTXOs(f.store, f.store, UTXOLimits{BatchSize: 100, MaxEntryBytes: 2000})
	if _, err := small.Create(f.ctx, tx("huge", 100)); !errors.Is(err, errcode.RequestTooLarge) {
		t.Fatalf("oversize record: %v", err)
	}
	if _, err := f.u.Get(f.ctx, h32("huge"), Linearizable); !errors.Is(err, errcode.TxNotFound) {
		t.Fatalf("an oversize create wrote something: %v", err)
	}
	for name, req := range map[string]wire.UTXOSpendRequest{
		"no spends":    {},
		"bad spender":  {Spends: []wire.UTXOSpend{{TxID: good.TxID, UTXOHash: h32("x/0"), SpendingTxID: "00"}}},
		"bad hash":     {Spends: []wire.UTXOSpend{{TxID: good.TxID, UTXOHash: "00", SpendingTxID: h32("c")}}},
		"ttl, no txn":  {Spends: []wire.UTXOSpend{sp("x", 0, "c", 0)}, TTLSeconds: 1},
		"negative ttl": {Spends: []wire.UTXOSpend{sp("x", 0, "c", 0)}, TxnID: xid.New().String(), TTLSeconds: -1},
	} {
		_, err := f.u.Spend(f.ctx, req)
		var e *errcode.Error
		if !errors.As(err, &e) || e.Code == errcode.UTXOSpendFailed.Code || e.Code == errcode.Internal.Code {
			t.Fatalf("%s: %v, want a 400 code", name, err)
		}
	}
}

// A transaction whose vouts, in records of the server's batch size, need
// more records than the state machine takes is refused as a bad request
// (invalid_utxo_request) before anything is proposed, not as a malformed
// command of the state machine.
func TestUTXOCreateOfTooManyRecordsIsABadRequest(t *testing.T) {
	f := newUTXOFixture(t, 4)
	req := wire.UTXOCreateRequest{TxID: h32("sparse"), Outputs: []wire.UTXOOutput{{Vout: maxVouts - 1, UTXOHash: h32("sparse/0"), Satoshis: 1}}}
	if _, err := f.u.Create(f.ctx, req); !errors.Is(err, errcode.InvalidUTXORequest) {
		t.Fatalf("create of %d records: %v, want %s", (maxVouts+3)/4, err, errcode.InvalidUTXORequest.Code)
	}
	if _, err := f.u.Get(f.ctx, req.TxID, Linearizable); !errors.Is(err, errcode.TxNotFound) {
		t.Fatalf("the refused create wrote something: %v", err)
	}
}

// A transaction listed twice (in either case) in a flag, preserve, mined or
// longest-chain request is one transaction: it is updated, or not found,
// once.
func TestUTXOTxidListedTwiceCountsOnce(t *testing.T) {
	f := newUTXOFixture(t, 0)
	f.create(tx("twice", 1))
	id := h32("twice")
	ids := []string{id, strings.ToUpper(id), h32("absent"), h32("absent")}
	for name, call := range map[string]func() (*wire.UTXOUpdateResponse, error){
		"conflicting": func() (*wire.UTXOUpdateResponse, error) {
			return f.u.SetConflicting(f.ctx, wire.UTXOFlagRequest{TxIDs: ids, Value: true})
		},
		"locked": func() (*wire.UTXOUpdateResponse, error) {
			return f.u.SetLocked(f.ctx, wire.UTXOFlagRequest{TxIDs: ids})
		},
		"preserve": func() (*wire.UTXOUpdateResponse, error) {
			return f.u.Preserve(f.ctx, wire.UTXOPreserveRequest{TxIDs: ids, UntilHeight: 10})
		},
		"mined": func() (*wire.UTXOUpdateResponse, error) {
			return f.u.SetMined(f.ctx, wire.UTXOMinedRequest{TxIDs: ids, BlockID: 1, BlockHeight: 1, OnLongestChain: true})
		},
		"longest chain": func() (*wire.UTXOUpdateResponse, error) {
			return f.u.SetLongestChain(f.ctx, wire.UTXOLongestChainRequest{TxIDs: ids, OnLongestChain: true})
		},
	} {
		out, err := call()
		if err != nil || out.Updated != 1 || !slices.Equal(out.NotFound, []string{h32("absent")}) {
			t.Errorf("%s of a transaction listed twice: %+v, %v; want 1 updated, 1 not found", name, out, err)
		}
	}
}

// ttl_seconds is compared with the maximum before it becomes a duration:
// values whose nanoseconds overflow (to a negative TTL, or around to an
// allowed one) are invalid_ttl like any other TTL above the maximum, and
// nothing is staged.
func TestUTXOTTLSecondsBeyondTheMaximum(t *testing.T) {
	f := newUTXOFixture(t, 0)
	f.create(tx("p", 1))
	for _, secs := range []int64{3601, 9223372037, 36028797018964568, 1 << 62} {
		req := tx(fmt.Sprintf("c%d", secs), 1)
		req.TxnID, req.TTLSeconds = xid.New().String(), secs
		if _, err := f.u.Create(f.ctx, req); !errors.Is(err, errcode.InvalidTTL) {
			t.Fatalf("create with ttl_seconds %d: %v", secs, err)
		}
		if _, err := f.u.Get(f.ctx, req.TxID, Linearizable); !errors.Is(err, errcode.TxNotFound) {
			t.Fatalf("create with ttl_seconds %d wrote something: %v", secs, err)
		}
		spend := wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{sp("p", 0, "c", 0)}, TxnID: xid.New().String(), TTLSeconds: secs}
		if _, err := f.u.Spend(f.ctx, spend); !errors.Is(err, errcode.InvalidTTL) {
			t.Fatalf("spend with ttl_seconds %d: %v", secs, err)
		}
	}
	if got := f.get("p").Outputs[0]; got.ReservedBy != "" || got.SpendingTxID != "" {
		t.Fatalf("a refused spend reserved the output: %+v", got)
	}
}

// A staged creation whose transaction is rolled back (by its client, or
// because its hold expired) between the lock and the records is refused
// with the rollback and leaves nothing: the transaction can be created
// and spent at once, instead of staying staged by the rolled back one.
func TestUTXOStagedCreateRolledBackBeforeItsRecords(t *testing.T) {
	for _, how := range []string{"rollback", "expiry"} {
		t.Run(how, func(t *testing.T) {
			f := newUTXOFixture(t, 2)
			txn := xid.New().String()
			f.u.step = func(_ context.Context, s string) error {
				if s == "lock" {
					if how == "rollback" {
						f.store.decide(t, txn, fsm.TxnRollback)
					} else {
						f.store.advance(5001)
						f.store.sweep(t)
					}
				}
				return nil
			}
			req := tx("late", 4)
			req.TxnID, req.TTLSeconds = txn, 5
			if _, err := f.u.Create(f.ctx, req); !errors.Is(err, errcode.TxnRolledBack) {
				t.Fatalf("records after the rollback: %v", err)
			}
			f.u.step = nil
			if _, err := f.u.Get(f.ctx, h32("late"), Linearizable); !errors.Is(err, errcode.TxNotFound) {
				t.Fatalf("left behind: %v", err)
			}
			f.create(tx("late", 4))
			if c := f.spendCode(sp("late", 3, "c", 0)); c != "" {
				t.Fatalf("spend: %q", c)
			}
		})
	}
}

// The height endpoint answers the height it set, 0 included; the other
// update endpoints answer no height.
func TestUTXOHeightIsAnsweredEvenWhenZero(t *testing.T) {
	f := newUTXOFixture(t, 100)
	for _, h := range []uint32{5, 0} {
		out, err := f.u.SetHeight(f.ctx, wire.UTXOHeightRequest{BlockHeight: h})
		if err != nil || out.BlockHeight == nil || *out.BlockHeight != h {
			t.Fatalf("height %d answered %+v, %v", h, out, err)
		}
		if raw, _ := json.Marshal(out); !strings.Contains(string(raw), `"block_height":`) {
			t.Fatalf("height %d answered %s", h, raw)
		}
	}
	out, err := f.u.SetLocked(f.ctx, wire.UTXOFlagRequest{TxIDs: []string{strings.Repeat("a", 64)}, Value: true})
	if err != nil || out.BlockHeight != nil {
		t.Fatalf("locked answered %+v, %v", out, err)
	}
}
