package tc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// applyStore applies what is proposed to a real state machine, stamped
// with its clock, which is also the coordinator's.
type applyStore struct {
	f     *fsm.FSM
	now   time.Time
	mu    sync.Mutex
	index uint64
}

func newApplyStore(t *testing.T, now time.Time) *applyStore {
	t.Helper()
	f := openFSM(t)
	return &applyStore{f: f, now: now}
}

func (s *applyStore) Now() time.Time { return s.now }

func (s *applyStore) Propose(_ context.Context, c *fsm.Command) (*fsm.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.Now = s.now.UnixMilli()
	data, err := fsm.Encode(c)
	if err != nil {
		return nil, err
	}
	s.index++
	res := s.f.ApplyBatch([]*raft.Log{{Index: s.index, Term: 1, Type: raft.LogCommand, Data: data}})[0].(*fsm.Result)
	if res.Err != nil {
		return nil, res.Err
	}
	return res, nil
}

func (s *applyStore) Read(_ context.Context, fn func(v *fsm.View) error) error { return s.f.View(fn) }

func (s *applyStore) entry(backend string) fsm.RMEntry {
	var e fsm.RMEntry
	_ = s.f.View(func(v *fsm.View) error { e = v.RMRecords()[backend]; return nil })
	return e
}

// fixedIsland is an island whose members serve endpoints.
type fixedIsland struct {
	backend   string
	endpoints []string
}

func (i fixedIsland) BackendHash() string                     { return i.backend }
func (i fixedIsland) Term() uint64                            { return 1 }
func (i fixedIsland) Endpoints() ([]string, time.Time, error) { return i.endpoints, time.Time{}, nil }
func (i fixedIsland) IsLeader() bool                          { return true }
func (i fixedIsland) LeaderEndpoint() string                  { return i.endpoints[0] }

// passedChange is a registry change a coordinator passed on.
type passedChange struct {
	at     string
	req    wire.TCRMRegisterRequest
	remove bool
}

// recordingRemote answers every registry change and records it.
type recordingRemote struct {
	Remote
	mu    sync.Mutex
	calls []passedChange
}

func (r *recordingRemote) Register(_ context.Context, at string, req wire.TCRMRegisterRequest, remove bool) (wire.TCRMRegisterResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, passedChange{at, req, remove})
	return wire.TCRMRegisterResponse{BackendHash: req.BackendHash}, nil
}

func (r *recordingRemote) to(at string) []passedChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []passedChange
	for _, c := range r.calls {
		if c.at == at {
			out = append(out, c)
		}
	}
	return out
}

// islandA is a coordinator of island a (endpoint https://a1) over a state
// machine at now, recording what it sends to other islands.
func islandA(t *testing.T, now time.Time) (*Coordinator, *applyStore, *recordingRemote) {
	t.Helper()
	store := newApplyStore(t, now)
	remote := &recordingRemote{}
	return New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store, Config{FanoutAttempts: 1}), store, remote
}

// The registry sync tells every island each endpoint with the time it was
// registered and each removal record with the time of the removal; an
// island is told only the removals of its own endpoints.
func TestSyncRegistryPassesOnTimesAndRemovals(t *testing.T) {
	now := time.UnixMilli(50_000_000)
	c, store, remote := islandA(t, now)
	ctx := context.Background()
	for _, ch := range []fsm.RMRegisterCmd{
		{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000},
		{Backend: "b", Endpoint: "https://b0", PassedOn: true, ChangedAt: 1_000},
		{Backend: "b", Endpoint: "https://b0", Remove: true, PassedOn: true, ChangedAt: 2_000},
		{Backend: "gone", Endpoint: "https://g1", PassedOn: true, ChangedAt: 1_000},
		{Backend: "gone", Endpoint: "https://g1", Remove: true, PassedOn: true, ChangedAt: 3_000},
	} {
		if _, err := c.Register(ctx, ch); err != nil {
			t.Fatalf("%+v: %v", ch, err)
		}
	}
	// The first sync registers the island's own endpoint (and passes that
	// on); the second only tells.
	for range 2 {
		remote.calls = nil
		if err := c.SyncRegistry(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e := store.entry("a"); e.Added["https://a1"] != now.UnixMilli() {
		t.Fatalf("the island's own entry after the sync: %+v", e)
	}
	want := []passedChange{
		{"https://b1", wire.TCRMRegisterRequest{BackendHash: "a", Endpoint: "https://a1", PassedOn: true, ChangedAtUnixMs: now.UnixMilli()}, false},
		{"https://b1", wire.TCRMRegisterRequest{BackendHash: "b", Endpoint: "https://b0", PassedOn: true, ChangedAtUnixMs: 2_000}, true},
		{"https://b1", wire.TCRMRegisterRequest{BackendHash: "gone", Endpoint: "https://g1", PassedOn: true, ChangedAtUnixMs: 3_000}, true},
	}
	if got := remote.to("https://b1"); !equalCalls(got, want) {
		t.Fatalf("b was told %+v, want %+v", got, want)
	}
	if got := remote.to("https://g1"); len(got) != 0 {
		t.Fatalf("an island without endpoints was told %+v", got)
	}
}

// A member endpoint missing from the island's own entry, removed there by
// a change another island passed on, is registered again at the current
// time, which wins over the removal everywhere.
func TestSyncRegistryRegistersALiveMemberAgainAfterARemoval(t *testing.T) {
	now := time.UnixMilli(50_000_000)
	c, store, _ := islandA(t, now)
	ctx := context.Background()
	if err := c.SyncRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	store.now = now.Add(time.Second)
	removedAt := store.now.UnixMilli() - 10
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "a", Endpoint: "https://a1", Remove: true, PassedOn: true,
		ChangedAt: removedAt}); err != nil {
		t.Fatal(err)
	}
	if e := store.entry("a"); len(e.Endpoints) != 0 {
		t.Fatalf("the removal was not recorded: %+v", e)
	}
	if err := c.SyncRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	if e := store.entry("a"); e.Added["https://a1"] != store.now.UnixMilli() || e.Added["https://a1"] <= removedAt {
		t.Fatalf("the live member after the sync: %+v", e)
	}
}

func equalCalls(a, b []passedChange) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An operator's retry is passed on again with the time the change was
// recorded, without recording it again; a removal passed on that is newer
// than the removal recorded here is recorded, though the endpoint is gone
// already, and passed on further.
func TestRegisterPassesOnTheRecordedTime(t *testing.T) {
	now := time.UnixMilli(50_000_000)
	c, store, remote := islandA(t, now)
	ctx := context.Background()
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	unregister := fsm.RMRegisterCmd{Backend: "gone", Endpoint: "https://g1", Remove: true}
	for i := range 2 {
		store.now = now.Add(time.Duration(i) * time.Second)
		if _, err := c.Register(ctx, unregister); err != nil {
			t.Fatal(err)
		}
	}
	sent := remote.to("https://b1")
	if len(sent) != 2 || sent[0] != sent[1] || sent[1].req.ChangedAtUnixMs != now.UnixMilli() || !sent[1].remove {
		t.Fatalf("the unregister and its retry were passed on as %+v, want both at %d", sent, now.UnixMilli())
	}
	if e := store.entry("gone"); e.Removed["https://g1"] != now.UnixMilli() {
		t.Fatalf("the retry recorded the removal again: %+v", e)
	}
	newer := fsm.RMRegisterCmd{Backend: "gone", Endpoint: "https://g1", Remove: true, PassedOn: true, ChangedAt: now.UnixMilli() + 5}
	info, err := c.Register(ctx, newer)
	if err != nil || !info.Changed || info.Entry.Removed["https://g1"] != newer.ChangedAt {
		t.Fatalf("a newer removal passed on: %+v %v", info, err)
	}
	if sent := remote.to("https://b1"); len(sent) != 3 || sent[2].req.ChangedAtUnixMs != newer.ChangedAt {
		t.Fatalf("the newer removal was passed on as %+v", sent)
	}
	if info, err := c.Register(ctx, newer); err != nil || info.Changed || len(remote.to("https://b1")) != 3 {
		t.Fatalf("the same removal passed on again: %+v %v, %d calls", info, err, len(remote.to("https://b1")))
	}
}

// applyingRemote applies every decision it is sent, and records where.
type applyingRemote struct {
	Remote
	mu      sync.Mutex
	applied []string
}

func (r *applyingRemote) Apply(_ context.Context, at string, req wire.TxnDecisionRequest) (wire.TxnDecisionResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, at)
	return wire.TxnDecisionResponse{TxnID: req.TxnID, State: req.State}, nil
}

// Before the island follows format 7, a decide on a decided transaction
// that names another island's key changes nothing, so the coordinator
// proposes nothing and tells nobody; from format 7 on it adds the island
// and tells it the decision.
func TestARepeatedDecideAddsIslandsOnlyUnderFormat7(t *testing.T) {
	now := time.UnixMilli(50_000_000)
	store := newApplyStore(t, now)
	remote := &applyingRemote{}
	c := New(store, fixedIsland{"a", []string{"https://a1"}}, remote, store, Config{FanoutAttempts: 1})
	ctx := context.Background()
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b1", PassedOn: true, ChangedAt: 1_000}); err != nil {
		t.Fatal(err)
	}
	txn := "d4u1jq0n4ncs73cnv2f0"
	if _, err := c.Decide(ctx, Decision{TxnID: txn, State: fsm.TxnRollback,
		Participants: []fsm.Participant{{Namespace: "default", Key: "ka"}}}); err != nil {
		t.Fatal(err)
	}
	naming := Decision{TxnID: txn, State: fsm.TxnRollback,
		Participants: []fsm.Participant{{Namespace: "default", Key: "ka"}, {Backend: "b", Namespace: "default", Key: "kb"}}}
	before := store.index
	info, err := c.Decide(ctx, naming)
	if err != nil || info.State != fsm.TxnRollback || len(info.Participants) != 1 {
		t.Fatalf("the repeated decide before format 7: %+v %v", info, err)
	}
	if store.index != before || len(remote.applied) != 0 {
		t.Fatalf("before format 7 the repeated decide proposed %d entries and told %v", store.index-before, remote.applied)
	}
	if _, err := store.Propose(ctx, &fsm.Command{Op: fsm.OpSweep, Sweep: &fsm.SweepCmd{Limit: 1, Format: fsm.EntryFormat}}); err != nil {
		t.Fatal(err)
	}
	info, err = c.Decide(ctx, naming)
	if err != nil || len(info.Participants) != 2 || len(info.Acked) != 1 || info.Acked[0] != "b" {
		t.Fatalf("the repeated decide under format 7: %+v %v", info, err)
	}
	if len(remote.applied) != 1 || remote.applied[0] != "https://b1" {
		t.Fatalf("the decision was sent to %v", remote.applied)
	}
}
